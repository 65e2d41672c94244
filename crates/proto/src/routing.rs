//! Routing by request class (Slice §3.1–3.3, its µproxy; bytes in
//! docs/PROTOCOL.md, "Routing table"): the name
//! space is cut into [`ROUTING_SITES`] logical sites, every inode records
//! the site it was made in (it travels in its [`Handle`](crate::manager::Handle)),
//! and a routing table maps each site to the manager (by its client
//! address) that serves it. Any manager answers any request correctly — the
//! database is the shared state — so the table only spreads the work.
//!
//! The table ([`RoutingTable`]) holds a version that only grows, the
//! policy, the managers' client addresses, and per site the index of its
//! manager. Reconfiguration: `nasd admin add-manager ADDR` takes
//! `floor(64/(N+1))` sites one at a time from whoever holds most
//! ([`RoutingTable::with_manager`]); `remove-manager` hands its sites to
//! whoever holds fewest ([`RoutingTable::without_manager`]); a property test
//! checks every site keeps exactly one manager and about 1/N move. Where the
//! site of a new inode comes from: `nasd_meta`'s `routing.rs`; how clients
//! route: `nasd_fs`'s `conn.rs`; the manager's cache: `nasd_manager::routing`.

use crate::codec::{Reader, Writer};
use crate::fs::Ino;
use crate::DecodeError;

/// Logical sites of a file system (fixed: a site is recorded in every inode).
pub const ROUTING_SITES: usize = 64;
/// Most managers a routing table names (each holds at least one site).
pub const ROUTING_MANAGERS_MAX: usize = ROUTING_SITES;
/// Longest manager address in a routing table (`host:port`).
pub const MANAGER_ADDR_MAX: usize = 256;
/// Longest encoded routing table.
pub const ROUTING_TABLE_LEN_MAX: usize = 8 + 1 + 1 + ROUTING_MANAGERS_MAX * (2 + MANAGER_ADDR_MAX) + ROUTING_SITES;

/// How new inodes choose their site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RoutingPolicy {
    /// Mkdir switching: a directory keeps its parent's site except, with
    /// the redirect probability, [`name_site`] of (parent, name); every
    /// other inode takes its directory's site.
    MkdirSwitching = 1,
    /// Name hashing: every inode made as (parent, name) takes
    /// [`name_site`] of them, and every (parent, name) request goes there.
    NameHashing = 2,
}

impl RoutingPolicy {
    /// The wire code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Parses a wire code.
    pub fn from_code(code: u8) -> Result<Self, DecodeError> {
        match code {
            1 => Ok(RoutingPolicy::MkdirSwitching),
            2 => Ok(RoutingPolicy::NameHashing),
            _ => Err(DecodeError::NotCanonical("unknown routing policy")),
        }
    }

    /// The configuration spelling (`routing = "..."`).
    pub fn name(self) -> &'static str {
        match self {
            RoutingPolicy::MkdirSwitching => "mkdir-switching",
            RoutingPolicy::NameHashing => "name-hashing",
        }
    }
}

impl std::str::FromStr for RoutingPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mkdir-switching" => Ok(RoutingPolicy::MkdirSwitching),
            "name-hashing" => Ok(RoutingPolicy::NameHashing),
            _ => Err(format!("unknown routing policy '{s}': mkdir-switching or name-hashing")),
        }
    }
}

/// The 64-bit hash of a name in a directory: FNV-1a over `parent u64`
/// (little-endian) then the name's bytes, then the splitmix64 finalizer
/// (so the low bits mix too). [`name_site`] is it modulo
/// [`ROUTING_SITES`]; managers draw mkdir redirects from its top 32 bits.
pub fn name_hash(parent: Ino, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parent.to_le_bytes().iter().chain(name.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The site of `name` in directory `parent`: [`name_hash`] mod [`ROUTING_SITES`].
pub fn name_site(parent: Ino, name: &str) -> u8 {
    (name_hash(parent, name) % ROUTING_SITES as u64) as u8
}

/// A routing table: a version that only grows, the policy, the managers
/// (client addresses, each holding at least one site) and, per site, the
/// index of its manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingTable {
    /// Grows by one with every change.
    pub version: u64,
    /// How new inodes choose their site.
    pub policy: RoutingPolicy,
    /// The managers' client addresses, distinct.
    pub managers: Vec<String>,
    /// Per site, an index into `managers`.
    pub sites: [u8; ROUTING_SITES],
}

/// Why a routing change cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutingError {
    /// The manager is in the table already.
    #[error("{0} is in the routing table already")]
    Present(String),
    /// The manager is not in the table.
    #[error("{0} is not in the routing table")]
    Absent(String),
    /// The last manager cannot be removed.
    #[error("{0} is the only manager in the routing table; add another first")]
    Last(String),
    /// The table names [`ROUTING_MANAGERS_MAX`] managers already.
    #[error("the routing table names {ROUTING_MANAGERS_MAX} managers already (ROUTING_MANAGERS_MAX)")]
    Full,
    /// The address is empty or too long.
    #[error("'{0}' is not a manager address (1 to {MANAGER_ADDR_MAX} bytes)")]
    BadAddress(String),
}

impl RoutingTable {
    /// Version 1: one manager holds every site.
    pub fn single(addr: &str, policy: RoutingPolicy) -> Self {
        RoutingTable { version: 1, policy, managers: vec![addr.to_string()], sites: [0; ROUTING_SITES] }
    }

    /// The manager serving `site` (taken modulo [`ROUTING_SITES`]).
    pub fn manager_of(&self, site: u8) -> &str {
        &self.managers[usize::from(self.sites[usize::from(site) % ROUTING_SITES])]
    }

    /// How many sites each manager holds, in `managers` order.
    pub fn holdings(&self) -> Vec<usize> {
        let mut held = vec![0; self.managers.len()];
        for s in self.sites {
            held[usize::from(s)] += 1;
        }
        held
    }

    /// The next version with `addr` added: it takes
    /// `floor(ROUTING_SITES / (N + 1))` sites, one at a time, each the
    /// highest-numbered site of whoever holds most then (the first such
    /// manager on a tie). Every other site stays where it is.
    pub fn with_manager(&self, addr: &str) -> Result<RoutingTable, RoutingError> {
        if addr.is_empty() || addr.len() > MANAGER_ADDR_MAX {
            return Err(RoutingError::BadAddress(addr.to_string()));
        }
        if self.managers.iter().any(|m| m == addr) {
            return Err(RoutingError::Present(addr.to_string()));
        }
        if self.managers.len() >= ROUTING_MANAGERS_MAX {
            return Err(RoutingError::Full);
        }
        let mut next = self.clone();
        next.version = self.version + 1;
        let new = next.managers.len() as u8;
        next.managers.push(addr.to_string());
        let take = ROUTING_SITES / next.managers.len();
        for _ in 0..take {
            let held = next.holdings();
            let most = (0..held.len()).max_by(|a, b| held[*a].cmp(&held[*b]).then(b.cmp(a))).expect("managers");
            let site = (0..ROUTING_SITES).rev().find(|s| usize::from(next.sites[*s]) == most).expect("holds a site");
            next.sites[site] = new;
        }
        Ok(next)
    }

    /// The next version without `addr`: its sites, in order, each go to
    /// whoever holds fewest then (the first such manager on a tie).
    pub fn without_manager(&self, addr: &str) -> Result<RoutingTable, RoutingError> {
        let gone =
            self.managers.iter().position(|m| m == addr).ok_or_else(|| RoutingError::Absent(addr.to_string()))?;
        if self.managers.len() == 1 {
            return Err(RoutingError::Last(addr.to_string()));
        }
        let mut next = self.clone();
        next.version = self.version + 1;
        next.managers.remove(gone);
        let gone = gone as u8;
        let mut held = vec![0usize; next.managers.len()];
        let mut orphans = Vec::new();
        for (site, m) in next.sites.iter_mut().enumerate() {
            match (*m).cmp(&gone) {
                std::cmp::Ordering::Less => held[usize::from(*m)] += 1,
                std::cmp::Ordering::Greater => {
                    *m -= 1;
                    held[usize::from(*m)] += 1;
                }
                std::cmp::Ordering::Equal => orphans.push(site),
            }
        }
        for site in orphans {
            let fewest = (0..held.len()).min_by(|a, b| held[*a].cmp(&held[*b]).then(a.cmp(b))).expect("managers");
            next.sites[site] = fewest as u8;
            held[fewest] += 1;
        }
        Ok(next)
    }

    /// Appends the canonical encoding: `version u64`, `policy u8`,
    /// `count u8` (1..=[`ROUTING_MANAGERS_MAX`]), that many addresses
    /// (strings of 1..=[`MANAGER_ADDR_MAX`] bytes, distinct), then
    /// [`ROUTING_SITES`] manager indexes `u8`.
    ///
    /// # Panics
    /// If the table breaks [`validate`](Self::validate).
    pub fn encode(&self, w: &mut Writer) {
        self.validate().expect("a valid routing table");
        w.u64(self.version).u8(self.policy.code()).u8(self.managers.len() as u8);
        for m in &self.managers {
            w.str(m);
        }
        w.raw(&self.sites);
    }

    /// Reads the canonical encoding.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let version = r.u64()?;
        let policy = RoutingPolicy::from_code(r.u8()?)?;
        let n = usize::from(r.u8()?);
        if n > ROUTING_MANAGERS_MAX {
            return Err(DecodeError::OverLimit {
                field: "routing managers",
                len: n as u64,
                max: ROUTING_MANAGERS_MAX as u64,
            });
        }
        let managers = (0..n).map(|_| r.str(MANAGER_ADDR_MAX, "manager address")).collect::<Result<Vec<_>, _>>()?;
        let sites = r.array()?;
        let table = RoutingTable { version, policy, managers, sites };
        table.validate()?;
        Ok(table)
    }

    /// The encoding on its own (as the metadata store keeps it).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(64 + ROUTING_SITES);
        self.encode(&mut w);
        w.into_vec()
    }

    /// Parses [`to_bytes`](Self::to_bytes).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let t = Self::decode(&mut r)?;
        r.finish()?;
        Ok(t)
    }

    /// Checks what the encoding requires: a version of at least 1, 1 to
    /// [`ROUTING_MANAGERS_MAX`] distinct non-empty addresses, every site's
    /// index naming one of them, and every manager holding a site.
    pub fn validate(&self) -> Result<(), DecodeError> {
        if self.version == 0 {
            return Err(DecodeError::NotCanonical("routing table version 0"));
        }
        if self.managers.is_empty() || self.managers.len() > ROUTING_MANAGERS_MAX {
            return Err(DecodeError::NotCanonical("routing table without managers, or with too many"));
        }
        for (i, m) in self.managers.iter().enumerate() {
            if m.is_empty() || m.len() > MANAGER_ADDR_MAX {
                return Err(DecodeError::NotCanonical("routing table manager address empty or too long"));
            }
            if self.managers[..i].contains(m) {
                return Err(DecodeError::NotCanonical("routing table names a manager twice"));
            }
        }
        if self.sites.iter().any(|s| usize::from(*s) >= self.managers.len()) {
            return Err(DecodeError::NotCanonical("routing table site names no manager"));
        }
        if self.holdings().contains(&0) {
            return Err(DecodeError::NotCanonical("routing table names a manager without sites"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn moved(a: &RoutingTable, b: &RoutingTable) -> usize {
        (0..ROUTING_SITES).filter(|s| a.manager_of(*s as u8) != b.manager_of(*s as u8)).count()
    }

    #[test]
    fn one_manager_holds_every_site() {
        let t = RoutingTable::single("10.0.0.1:7000", RoutingPolicy::MkdirSwitching);
        assert_eq!(t.holdings(), vec![ROUTING_SITES]);
        assert_eq!(RoutingTable::from_bytes(&t.to_bytes()).unwrap(), t);
        assert_eq!(t.without_manager("10.0.0.1:7000"), Err(RoutingError::Last("10.0.0.1:7000".into())));
        assert_eq!(t.with_manager("10.0.0.1:7000"), Err(RoutingError::Present("10.0.0.1:7000".into())));
        assert_eq!(t.without_manager("x:1"), Err(RoutingError::Absent("x:1".into())));
    }

    #[test]
    fn growing_one_to_four_balances_and_moves_only_to_the_newcomer() {
        let mut t = RoutingTable::single("m0:1", RoutingPolicy::MkdirSwitching);
        for n in 1..4 {
            let next = t.with_manager(&format!("m{n}:1")).unwrap();
            assert_eq!(next.version, t.version + 1);
            assert_eq!(moved(&t, &next), ROUTING_SITES / (n + 1), "adding to {n} managers");
            for s in 0..ROUTING_SITES {
                if t.sites[s] != next.sites[s] {
                    assert_eq!(usize::from(next.sites[s]), n, "a moved site goes to the newcomer only");
                }
            }
            t = next;
        }
        assert_eq!(t.holdings(), vec![16, 16, 16, 16]);
    }

    #[test]
    fn decoding_refuses_tables_that_break_the_rules() {
        let good = RoutingTable::single("a:1", RoutingPolicy::NameHashing).with_manager("b:1").unwrap();
        let bytes = good.to_bytes();
        let mut bad = bytes.clone();
        *bad.last_mut().unwrap() = 2; // a site naming no manager
        assert!(RoutingTable::from_bytes(&bad).is_err());
        let mut bad = bytes.clone();
        bad[8] = 3; // an unknown policy
        assert!(RoutingTable::from_bytes(&bad).is_err());
        let mut bad = bytes.clone();
        bad[0..8].copy_from_slice(&0u64.to_le_bytes());
        assert!(RoutingTable::from_bytes(&bad).is_err());
        let mut bad = bytes.clone();
        bad.push(0);
        assert!(RoutingTable::from_bytes(&bad).is_err());
        assert!(RoutingTable::from_bytes(&bytes[..bytes.len() - 1]).is_err());
        let mut twice = good.clone();
        twice.managers[1] = "a:1".into();
        assert!(twice.validate().is_err());
        let mut idle = good.clone();
        idle.sites = [0; ROUTING_SITES];
        assert!(idle.validate().is_err(), "a manager holding no site");
    }

    #[test]
    fn name_sites_spread_over_every_site() {
        let mut seen = [0usize; ROUTING_SITES];
        for i in 0..6400 {
            seen[usize::from(name_site(1, &format!("d{i}")))] += 1;
        }
        assert!(seen.iter().all(|n| *n > 40 && *n < 200), "{seen:?}");
        assert_ne!(name_site(1, "a"), name_site(2, "a"));
    }

    proptest! {
        /// Any sequence of additions and removals keeps every site with
        /// exactly one listed manager, every manager with a site, and moves
        /// floor(64/(N+1)) sites on an addition and only the leaver's on a
        /// removal — about 1/N either way.
        #[test]
        fn reconfiguration_moves_about_one_nth(ops in proptest::collection::vec((any::<bool>(), 0usize..12), 1..40)) {
            let mut t = RoutingTable::single("m0:1", RoutingPolicy::MkdirSwitching);
            for (add, which) in ops {
                let n = t.managers.len();
                let next = if add {
                    match t.with_manager(&format!("m{which}:1")) {
                        Ok(next) => {
                            prop_assert_eq!(moved(&t, &next), ROUTING_SITES / (n + 1));
                            next
                        }
                        Err(RoutingError::Present(_)) => continue,
                        Err(e) => panic!("{e}"),
                    }
                } else {
                    let addr = t.managers[which % n].clone();
                    match t.without_manager(&addr) {
                        Ok(next) => {
                            let held = t.holdings()[which % n];
                            prop_assert_eq!(moved(&t, &next), held);
                            // The leaver held no more than ceil(64/N) + 1 (balanced within one, plus rounding).
                            prop_assert!(held <= ROUTING_SITES / n + 2, "held {} of {} managers", held, n);
                            next
                        }
                        Err(RoutingError::Last(_)) => continue,
                        Err(e) => panic!("{e}"),
                    }
                };
                prop_assert_eq!(next.version, t.version + 1);
                prop_assert!(next.validate().is_ok());
                let held = next.holdings();
                prop_assert_eq!(held.iter().sum::<usize>(), ROUTING_SITES);
                let (lo, hi) = (held.iter().min().unwrap(), held.iter().max().unwrap());
                prop_assert!(hi - lo <= 2, "balanced within two: {:?}", held);
                prop_assert_eq!(RoutingTable::from_bytes(&next.to_bytes()).unwrap(), next.clone());
                t = next;
            }
        }
    }
}
