//! Where a new file's components go (LegionFS §3.4: placement from device
//! metadata): distinct drives, distinct failure domains while there are
//! domains left, weighted by free space and away from drives that took many
//! placements lately. Every file draws its own drives, so files are
//! declustered over the whole cluster.
//!
//! Pure: the manager gathers [`Candidate`]s from its cluster map and passes a
//! random source; tests use a seeded one.

use rand::Rng;
use std::collections::{HashMap, HashSet};

/// A drive that may take a component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The manager's number for it.
    pub drive: u32,
    /// Its failure domain; empty means a domain of its own.
    pub failure_domain: String,
    /// Free bytes as last reported.
    pub free_bytes: u64,
    /// Components placed on it recently (decays; see [`Recent`]).
    pub recent: u64,
}

/// Not enough drives for the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooFewDrives {
    /// Components the layout needs (one drive each).
    pub needed: usize,
    /// Drives that could take one.
    pub available: usize,
}

impl std::fmt::Display for TooFewDrives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the layout needs {} drives and {} can take a component now: add drives or choose a narrower layout",
            self.needed, self.available
        )
    }
}

/// Weight of a candidate: free space, divided by one plus its recent
/// placements so a burst of creates spreads out. Never 0, so a full-looking
/// drive can still be drawn when nothing else is left (its pool decides).
fn weight(c: &Candidate) -> f64 {
    (c.free_bytes as f64 / (1 + c.recent) as f64).max(1.0)
}

fn domain_of(c: &Candidate) -> String {
    if c.failure_domain.is_empty() {
        format!("\u{0}drive-{}", c.drive)
    } else {
        c.failure_domain.clone()
    }
}

/// Chooses `n` distinct drives from `candidates`: each pick is drawn with
/// probability proportional to [`weight`] among the drives not picked yet
/// whose failure domain holds the fewest of this file's components so far —
/// so a file spans as many domains as there are, and spreads evenly over
/// them when it has more components than domains. The order of the result is
/// the component order.
///
/// # Errors
/// [`TooFewDrives`] if fewer than `n` candidates exist.
pub fn choose(n: usize, candidates: &[Candidate], rng: &mut impl Rng) -> Result<Vec<u32>, TooFewDrives> {
    let distinct: HashSet<u32> = candidates.iter().map(|c| c.drive).collect();
    if distinct.len() < n {
        return Err(TooFewDrives { needed: n, available: distinct.len() });
    }
    let mut picked: Vec<u32> = Vec::with_capacity(n);
    let mut per_domain: HashMap<String, usize> = HashMap::new();
    while picked.len() < n {
        let free: Vec<&Candidate> = candidates.iter().filter(|c| !picked.contains(&c.drive)).collect();
        let load = |c: &Candidate| per_domain.get(&domain_of(c)).copied().unwrap_or(0);
        let least = free.iter().map(|c| load(c)).min().expect("enough distinct drives checked above");
        let pool: Vec<&Candidate> = free.iter().copied().filter(|c| load(c) == least).collect();
        let chosen = draw(&pool, rng);
        *per_domain.entry(domain_of(chosen)).or_default() += 1;
        picked.push(chosen.drive);
    }
    assert_eq!(picked.iter().collect::<HashSet<_>>().len(), n, "placement picked a drive twice");
    Ok(picked)
}

/// One draw, proportional to weight.
fn draw<'a>(pool: &[&'a Candidate], rng: &mut impl Rng) -> &'a Candidate {
    assert!(!pool.is_empty(), "draw from an empty pool");
    let total: f64 = pool.iter().map(|c| weight(c)).sum();
    let mut x = rng.gen::<f64>() * total;
    for c in pool {
        x -= weight(c);
        if x < 0.0 {
            return c;
        }
    }
    pool[pool.len() - 1]
}

/// Recent placements per drive, halved every [`RECENT_HALF_LIFE`] so the
/// count reflects the last few seconds of creates.
#[derive(Debug, Default)]
pub struct Recent {
    counts: HashMap<u32, u64>,
    last_decay: Option<tokio::time::Instant>,
}

/// How often recent-placement counts halve.
pub const RECENT_HALF_LIFE: std::time::Duration = std::time::Duration::from_secs(2);

impl Recent {
    /// Counts one placement on each of `drives`.
    pub fn record(&mut self, drives: &[u32], now: tokio::time::Instant) {
        self.decay(now);
        for d in drives {
            *self.counts.entry(*d).or_default() += 1;
        }
    }

    /// Recent placements on `drive`.
    pub fn of(&mut self, drive: u32, now: tokio::time::Instant) -> u64 {
        self.decay(now);
        self.counts.get(&drive).copied().unwrap_or(0)
    }

    fn decay(&mut self, now: tokio::time::Instant) {
        let last = *self.last_decay.get_or_insert(now);
        let halvings = now.saturating_duration_since(last).as_secs_f64() / RECENT_HALF_LIFE.as_secs_f64();
        if halvings >= 1.0 {
            let shift = (halvings as u32).min(63);
            self.counts.retain(|_, c| {
                *c >>= shift;
                *c > 0
            });
            self.last_decay = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn cand(drive: u32, domain: &str, free_gib: u64) -> Candidate {
        Candidate { drive, failure_domain: domain.into(), free_bytes: free_gib << 30, recent: 0 }
    }

    #[test]
    fn picks_distinct_drives_and_refuses_too_few() {
        let cs: Vec<_> = (0..4).map(|d| cand(d, "", 10)).collect();
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..100 {
            let p = choose(4, &cs, &mut rng).unwrap();
            assert_eq!(p.iter().collect::<HashSet<_>>().len(), 4);
        }
        assert_eq!(choose(5, &cs, &mut rng), Err(TooFewDrives { needed: 5, available: 4 }));
    }

    #[test]
    fn spreads_over_failure_domains_before_reusing_one() {
        // Two racks of three drives: a 2-component file always spans both racks.
        let cs: Vec<_> = (0..6).map(|d| cand(d, if d < 3 { "rack-a" } else { "rack-b" }, 10)).collect();
        let mut rng = StdRng::seed_from_u64(2);
        for _ in 0..200 {
            let p = choose(2, &cs, &mut rng).unwrap();
            assert_ne!(p[0] < 3, p[1] < 3, "{p:?} in one rack");
            // Four components: both racks twice.
            let p = choose(4, &cs, &mut rng).unwrap();
            assert_eq!(p.iter().filter(|&&d| d < 3).count(), 2, "{p:?}");
        }
    }

    #[test]
    fn draws_follow_free_space_and_recent_placements() {
        // Drive 0 has three times the free space of drive 1.
        let mut cs = vec![cand(0, "", 30), cand(1, "", 10)];
        let mut rng = StdRng::seed_from_u64(3);
        let zero = (0..4000).filter(|_| choose(1, &cs, &mut rng).unwrap()[0] == 0).count();
        assert!((2700..3300).contains(&zero), "drive 0 drawn {zero} of 4000 times, expected ~3000");
        // Many recent placements on drive 0 turn the odds around.
        cs[0].recent = 8;
        let zero = (0..4000).filter(|_| choose(1, &cs, &mut rng).unwrap()[0] == 0).count();
        assert!(zero < 1800, "drive 0 drawn {zero} of 4000 times despite 8 recent placements");
    }

    #[test]
    fn files_are_declustered() {
        // 8 drives, 3-component files: every pair of drives ends up sharing some file.
        let cs: Vec<_> = (0..8).map(|d| cand(d, "", 10)).collect();
        let mut rng = StdRng::seed_from_u64(4);
        let mut pairs = HashSet::new();
        for _ in 0..300 {
            let p = choose(3, &cs, &mut rng).unwrap();
            for a in &p {
                for b in &p {
                    if a < b {
                        pairs.insert((*a, *b));
                    }
                }
            }
        }
        assert_eq!(pairs.len(), 8 * 7 / 2);
    }

    #[test]
    fn recent_counts_decay() {
        let mut r = Recent::default();
        let t0 = tokio::time::Instant::now();
        r.record(&[1, 1, 1, 1], t0);
        assert_eq!(r.of(1, t0), 4);
        assert_eq!(r.of(1, t0 + RECENT_HALF_LIFE), 2);
        assert_eq!(r.of(1, t0 + RECENT_HALF_LIFE * 10), 0);
    }
}
