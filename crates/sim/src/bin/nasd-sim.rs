//! `nasd-sim`: plays seeds of the deterministic simulation.
//!
//! ```text
//! nasd-sim --seed 42 [--log]        one seed (with --log, its event log on stderr)
//! nasd-sim --seeds 1000 [--from 0]   many seeds; stops at the first failure
//! nasd-sim --seed 42 --bug skip-block-sync
//! nasd-sim --cluster --seed 42       the whole cluster: manager, drives, file clients
//! ```

use clap::Parser;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "nasd-sim", about = "nasd's deterministic simulation: drives, clients and faults from a seed")]
struct Args {
    /// Play this seed.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Play this many seeds, from --from on.
    #[arg(long)]
    seeds: Option<u64>,
    /// The first seed of --seeds.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Arm a deliberate bug (skip-block-sync, accept-stale-acv, skip-rebuild, skip-metadata-sync, skip-revocation, keep-retired-working-key, skip-identity-key-sync).
    #[arg(long = "bug")]
    bugs: Vec<String>,
    /// Simulated seconds of workload per seed.
    #[arg(long, default_value_t = 120)]
    duration: u64,
    /// Drives.
    #[arg(long, default_value_t = 3)]
    drives: usize,
    /// Clients.
    #[arg(long, default_value_t = 3)]
    clients: usize,
    /// Print the event log.
    #[arg(long)]
    log: bool,
    /// Go on after a failure.
    #[arg(long)]
    keep_going: bool,
    /// Simulate the whole cluster (the manager, drives, file-system clients)
    /// instead of drives and direct clients.
    #[arg(long)]
    cluster: bool,
}

fn main() {
    let args = Args::parse();
    let mut cfg = nasd_sim::Config {
        duration: Duration::from_secs(args.duration),
        drives: args.drives.max(1),
        clients: args.clients.max(1),
        echo: args.log,
        cluster: args.cluster,
        ..Default::default()
    };
    for b in &args.bugs {
        match nasd_sim::bug_by_name(b) {
            Some(bug) => {
                cfg.bugs.insert(bug);
            }
            None => {
                eprintln!(
                    "unknown bug {b}: skip-block-sync, accept-stale-acv, skip-rebuild, skip-metadata-sync, \
                     skip-revocation, keep-retired-working-key or skip-identity-key-sync"
                );
                std::process::exit(2);
            }
        }
    }
    let seeds: Vec<u64> = match (args.seed, args.seeds) {
        (Some(s), _) => vec![s],
        (None, Some(n)) => (args.from..args.from + n).collect(),
        (None, None) => vec![0],
    };
    let started = Instant::now();
    let (mut passed, mut failed, mut simulated) = (0u64, 0u64, Duration::ZERO);
    for seed in seeds {
        let r = nasd_sim::run(seed, &cfg);
        simulated += r.simulated;
        if r.passed() {
            passed += 1;
            println!("{}", r.summary());
        } else {
            failed += 1;
            println!("{}", r.summary());
            if !args.keep_going {
                break;
            }
        }
    }
    let real = started.elapsed().as_secs_f64();
    println!(
        "{passed} passed, {failed} failed: {:.2} simulated hours in {real:.0} s ({:.0}x real time)",
        simulated.as_secs_f64() / 3600.0,
        simulated.as_secs_f64() / real.max(f64::MIN_POSITIVE)
    );
    if failed > 0 {
        std::process::exit(1);
    }
}
