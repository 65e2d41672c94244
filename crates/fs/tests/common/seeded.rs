//! Randomness for tests from one printed seed (`NASD_SEED` repeats a run).

#![allow(dead_code)]

/// xorshift64*: a test's only source of randomness, from the printed seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// `$NASD_SEED`, else one drawn from the clock; printed with `what`, and
/// odd (xorshift's state must not be 0).
pub fn seed(what: &str) -> u64 {
    let seed = std::env::var("NASD_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("{what}: NASD_SEED={seed}");
    seed | 1
}
