//! A password-guessing burst from one host, for the tests of login pacing
//! at the manager (`manager_limits.rs`) and at the authentication server
//! (`auth.rs`): many connections, started at times drawn from a seed, each
//! guessing until the server closes it. A test first fails
//! [`WARM_UP_FAILURES`] logins one after another, so the burst meets the
//! host's turns at their widest (a host with no failure yet is not paced:
//! a burst arriving all at once would be checked at once). A test includes
//! it with `#[path = "common/guessing.rs"] mod guessing;`.

#![allow(dead_code)] // each test binary uses part of it

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Failed logins before a burst: turns start `LOGIN_BACKOFF_MIN` (100 ms)
/// apart and double with each failure, reaching `LOGIN_BACKOFF_MAX` (2 s)
/// at the sixth.
pub const WARM_UP_FAILURES: u64 = 6;

/// Fewest connections in a burst: with turns 2 s apart (`LOGIN_BACKOFF_MAX`)
/// these are far more than a 10 s login deadline lets the server check.
pub const GUESSERS_MIN: u64 = 48;
/// Most connections in a burst: below the 128 a host may hold at once
/// (`SESSIONS_PER_PEER_MAX`, `AUTH_SESSIONS_PER_PEER_MAX`), so none is
/// refused at accept.
pub const GUESSERS_MAX: u64 = 96;
/// The burst's connections start within this much of its first.
pub const SPREAD_MS_MAX: u64 = 4000;

/// The seed of a burst: `NASD_GUESS_SEED` if set (to replay a run), else
/// fresh; printed either way.
pub fn burst_seed() -> u64 {
    let seed = match std::env::var("NASD_GUESS_SEED") {
        Ok(s) => s.parse().expect("NASD_GUESS_SEED is a u64"),
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
    };
    eprintln!("guessing burst seed {seed} (NASD_GUESS_SEED={seed} replays its schedule)");
    seed
}

/// splitmix64: the burst's schedule from its seed.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Runs a burst: between `GUESSERS_MIN` and `GUESSERS_MAX` calls of
/// `guesser` (each one connection that guesses until it is closed), started
/// within up to `SPREAD_MS_MAX` of one another, as `seed` draws them;
/// returns once every one has ended, with how many there were.
pub async fn guessing_burst<F, Fut>(seed: u64, guesser: F) -> u64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut state = seed;
    let guessers = GUESSERS_MIN + next(&mut state) % (GUESSERS_MAX - GUESSERS_MIN + 1);
    let spread_ms = next(&mut state) % (SPREAD_MS_MAX + 1);
    eprintln!("{guessers} guessing connections over {spread_ms} ms");
    let guesser = Arc::new(guesser);
    let mut running = tokio::task::JoinSet::new();
    for i in 0..guessers {
        let start = Duration::from_millis(next(&mut state) % (spread_ms + 1));
        let guesser = guesser.clone();
        running.spawn(async move {
            tokio::time::sleep(start).await;
            guesser(i).await
        });
    }
    while let Some(done) = running.join_next().await {
        done.expect("a guessing connection");
    }
    guessers
}
