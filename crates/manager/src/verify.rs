//! Which components of a file hold its committed bytes, stripe by stripe
//! (`repair.rs`): pure functions the repair task uses.
//!
//! The metadata records, per component, the ranges it missed ("stale
//! ranges"). A stripe can be rebuilt from the components not stale in it as
//! long as the layout tolerates the others ([`stretches`] tells which
//! components are stale where). Where more components are recorded stale in
//! a stripe than the layout tolerates — bookkeeping of an older manager that
//! marked components stale which had missed nothing, or a change that reached
//! a component nobody recorded — the bytes the drives hold decide
//! ([`current_in_stripe`]): the stripe's components, without the suspects
//! that disagree with them, must form one consistent Reed-Solomon codeword
//! (or equal mirror copies) with more members than it takes to determine it,
//! so that the agreement is evidence, and no other choice of dissenters may
//! do as well. Where the bytes cannot tell (as many suspects as members
//! beyond what determines the stripe, all disagreeing), nothing is decided:
//! the components stay stale and the file's stripe unreadable rather than
//! rebuilt from a guess. The drive checks each block it returns against its
//! stored digest, so a chunk read is the chunk written.

use nasd_meta::StaleRange;
use nasd_proto::layout::Scheme;
use nasd_stripe::coding::Coder;
use nasd_stripe::geometry::{Geometry, Role};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// Choices of dissenting suspects tried per stripe (or mirror column) before
/// the stripe is left undecided: bounds the work for wide layouts.
pub const SUBSETS_PER_STRIPE_MAX: usize = 256;

/// A stretch of component space (the same for every component of a file:
/// they share one shape), whole stripes, and the components recorded stale
/// somewhere in each of its stripes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stretch {
    /// Component offsets, stripe-aligned.
    pub span: Range<u64>,
    /// Components stale in every stripe of it.
    pub suspects: BTreeSet<usize>,
}

/// Splits `[0, extent)` where the set of stale components changes, each
/// component's stale ranges (`stale`; an empty list: stale whole) widened to
/// whole stripes of `unit` bytes: a stripe is rebuilt from its other chunks,
/// so one stale byte in it makes the component's chunk unusable for the
/// others. Stretches with no stale component are left out; ascending.
pub fn stretches(stale: &BTreeMap<usize, Vec<StaleRange>>, unit: u64, extent: u64) -> Vec<Stretch> {
    assert!(unit > 0, "a stripe unit");
    // (offset, opens, component): where a component's widened range starts or ends.
    let mut edges: Vec<(u64, bool, usize)> = Vec::new();
    const WHOLE: [StaleRange; 1] = [StaleRange { offset: 0, length: u64::MAX }];
    for (&c, ranges) in stale {
        let ranges = if ranges.is_empty() { &WHOLE[..] } else { &ranges[..] };
        for r in ranges {
            let a = r.offset / unit * unit;
            let b = r.end().div_ceil(unit).saturating_mul(unit).min(extent);
            if a < b {
                edges.push((a, true, c));
                edges.push((b, false, c));
            }
        }
    }
    // At one offset, ends before starts: touching ranges of one component stay one.
    edges.sort_by_key(|&(at, opens, c)| (at, opens, c));
    let mut open: BTreeMap<usize, usize> = BTreeMap::new();
    let mut out: Vec<Stretch> = Vec::new();
    let mut at = 0;
    for (x, opens, c) in edges {
        if x > at && !open.is_empty() {
            let suspects: BTreeSet<usize> = open.keys().copied().collect();
            match out.last_mut() {
                Some(last) if last.span.end == at && last.suspects == suspects => last.span.end = x,
                _ => out.push(Stretch { span: at..x, suspects }),
            }
        }
        at = x;
        let n = open.entry(c).or_insert(0);
        if opens {
            *n += 1;
        } else {
            *n -= 1;
            if *n == 0 {
                open.remove(&c);
            }
        }
    }
    out
}

/// The components in `suspects` that hold the committed bytes of stripe
/// `stripe` of a file of `size` bytes laid out by `g`, judged from what
/// every component holds there: `chunks[c]` is component `c`'s `unit` bytes
/// of the stripe (zeros past its object's end), or None if it could not be
/// read. See the module documentation for the rule; a suspect whose bytes
/// past the file's end in this stripe are not zero holds something the file
/// does not, and is never current.
pub fn current_in_stripe(
    g: &Geometry,
    size: u64,
    stripe: u64,
    chunks: &[Option<Vec<u8>>],
    suspects: &BTreeSet<usize>,
) -> BTreeSet<usize> {
    assert_eq!(chunks.len(), g.components(), "one entry per component");
    match g.layout().scheme {
        Scheme::Stripe { .. } => BTreeSet::new(),
        Scheme::Mirror { .. } => (0..g.data_columns())
            .flat_map(|column| {
                let copies: Vec<usize> = (0..g.copies()).map(|r| g.data_component(column, r)).collect();
                let len = g.chunk_len(size, stripe, column) as usize;
                let held = |c: usize| chunks[c].as_deref().filter(|b| is_zero(&b[len.min(b.len())..]));
                let candidates: Vec<usize> = copies.into_iter().filter(|&c| held(c).is_some()).collect();
                let same = |members: &[usize]| {
                    let first = held(members[0]).expect("a candidate");
                    members.iter().all(|&c| held(c).expect("a candidate")[..len] == first[..len])
                };
                current_members(&candidates, suspects, 1, same)
            })
            .collect(),
        Scheme::ReedSolomon { .. } => {
            let plen = g.parity_chunk_len(size, stripe) as usize;
            let len = |c: usize| match g.role(c) {
                Role::Data { column, .. } => g.chunk_len(size, stripe, column) as usize,
                Role::Parity { .. } => plen,
            };
            let held =
                |c: usize| chunks[c].as_deref().filter(|b| b.len() >= plen && is_zero(&b[len(c).min(b.len())..]));
            let candidates: Vec<usize> = (0..g.components()).filter(|&c| held(c).is_some()).collect();
            let Ok(coder) = Coder::new(g.data_columns(), g.parity()) else { return BTreeSet::new() };
            let codeword =
                |members: &[usize]| one_codeword(&coder, plen, members, |c| &held(c).expect("a candidate")[..plen]);
            current_members(&candidates, suspects, g.data_columns(), codeword)
        }
    }
}

/// Whether every byte is zero.
fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// Whether the shards of `members` (ascending component indices; data
/// components first, as the code numbers them) all belong to one codeword:
/// the first `k` determine it, the rest must match it.
fn one_codeword<'a>(coder: &Coder, plen: usize, members: &[usize], shard: impl Fn(usize) -> &'a [u8]) -> bool {
    let k = coder.data();
    let mut shards: Vec<Option<Vec<u8>>> = vec![None; k + coder.parity()];
    for &c in &members[..k] {
        shards[c] = Some(shard(c).to_vec());
    }
    if coder.reconstruct(&mut shards, plen, true).is_err() {
        return false;
    }
    members[k..].iter().all(|&c| shards[c].as_deref().is_some_and(|s| s[..plen] == *shard(c)))
}

/// The members of `suspects` among `candidates` that agree with the
/// others: the smallest set of dissenting suspects leaving more than `need`
/// members that `agree`, if it is the only one of its size (else none: the
/// bytes cannot tell).
fn current_members(
    candidates: &[usize],
    suspects: &BTreeSet<usize>,
    need: usize,
    agree: impl Fn(&[usize]) -> bool,
) -> BTreeSet<usize> {
    if candidates.len() <= need {
        return BTreeSet::new();
    }
    let suspected: Vec<usize> = candidates.iter().copied().filter(|c| suspects.contains(c)).collect();
    let most_out = (candidates.len() - need - 1).min(suspected.len());
    let mut tried = 0;
    for out in 0..=most_out {
        let mut agreeing: Vec<Vec<usize>> = Vec::new();
        for dissenters in combinations(&suspected, out) {
            tried += 1;
            if tried > SUBSETS_PER_STRIPE_MAX {
                return BTreeSet::new();
            }
            let members: Vec<usize> = candidates.iter().copied().filter(|c| !dissenters.contains(c)).collect();
            if agree(&members) {
                agreeing.push(dissenters);
                if agreeing.len() > 1 {
                    return BTreeSet::new();
                }
            }
        }
        if let Some(dissenters) = agreeing.pop() {
            return suspected.into_iter().filter(|c| !dissenters.contains(c)).collect();
        }
    }
    BTreeSet::new()
}

/// Every choice of `n` of `items`, in lexicographic order of positions.
fn combinations(items: &[usize], n: usize) -> Vec<Vec<usize>> {
    if n > items.len() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut pick: Vec<usize> = (0..n).collect();
    loop {
        out.push(pick.iter().map(|&i| items[i]).collect());
        if out.len() > SUBSETS_PER_STRIPE_MAX {
            return out;
        }
        // The rightmost position that can still move right.
        let Some(i) = (0..n).rev().find(|&i| pick[i] < items.len() - n + i) else { return out };
        pick[i] += 1;
        for j in i + 1..n {
            pick[j] = pick[j - 1] + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nasd_proto::layout::Layout;

    fn g(text: &str) -> Geometry {
        Geometry::new(Layout::parse(text).unwrap()).unwrap()
    }

    fn r(offset: u64, length: u64) -> StaleRange {
        StaleRange { offset, length }
    }

    fn set(c: &[usize]) -> BTreeSet<usize> {
        c.iter().copied().collect()
    }

    #[test]
    fn stretches_widen_to_stripes_and_split_where_suspects_change() {
        let u = 100;
        let stale = BTreeMap::from([(0, vec![r(150, 10)]), (1, vec![r(120, 300)]), (2, vec![])]);
        assert_eq!(
            stretches(&stale, u, 1000),
            vec![
                Stretch { span: 0..100, suspects: set(&[2]) },
                Stretch { span: 100..200, suspects: set(&[0, 1, 2]) },
                Stretch { span: 200..500, suspects: set(&[1, 2]) },
                Stretch { span: 500..1000, suspects: set(&[2]) },
            ]
        );
        // Past the extent nothing; touching ranges of one component are one stretch.
        let stale = BTreeMap::from([(0, vec![r(0, 50), r(50, 50), r(2000, 10)])]);
        assert_eq!(stretches(&stale, u, 1000), vec![Stretch { span: 0..100, suspects: set(&[0]) }]);
        assert_eq!(stretches(&BTreeMap::new(), u, 1000), vec![]);
        assert_eq!(stretches(&BTreeMap::from([(3, vec![])]), u, 0), vec![]);
    }

    #[test]
    fn combinations_in_order() {
        assert_eq!(combinations(&[4, 5, 6], 2), vec![vec![4, 5], vec![4, 6], vec![5, 6]]);
        assert_eq!(combinations(&[4, 5], 0), vec![Vec::<usize>::new()]);
        assert_eq!(combinations(&[4], 2), Vec::<Vec<usize>>::new());
    }

    /// Chunks of stripe 0 of an `rs:K+M@4K` file of `size` bytes holding `data`.
    fn rs_chunks(g: &Geometry, data: &[u8]) -> Vec<Option<Vec<u8>>> {
        let (k, u) = (g.data_columns(), g.unit() as usize);
        let size = data.len() as u64;
        let plen = g.parity_chunk_len(size, 0) as usize;
        let columns: Vec<&[u8]> =
            (0..k).map(|c| &data[(c * u).min(data.len())..((c + 1) * u).min(data.len())]).collect();
        let parity = Coder::new(k, g.parity()).unwrap().encode(&columns, plen).unwrap();
        let mut out: Vec<Option<Vec<u8>>> = columns.iter().map(|c| Some(c.to_vec())).collect();
        out.extend(parity.into_iter().map(Some));
        for c in out.iter_mut().flatten() {
            c.resize(u, 0);
        }
        out
    }

    fn bytes(seed: u8, n: usize) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn a_consistent_stripe_clears_every_suspect() {
        let geo = g("rs:2+1@4K");
        let data = bytes(1, 8192);
        let chunks = rs_chunks(&geo, &data);
        assert_eq!(current_in_stripe(&geo, 8192, 0, &chunks, &set(&[0, 2])), set(&[0, 2]));
        assert_eq!(current_in_stripe(&geo, 8192, 0, &chunks, &set(&[0, 1, 2])), set(&[0, 1, 2]));
        // A short last stripe: column 1 holds 100 bytes, the parity 128.
        let data = bytes(2, 4096 + 100);
        let chunks = rs_chunks(&geo, &data);
        assert_eq!(current_in_stripe(&geo, data.len() as u64, 0, &chunks, &set(&[1, 2])), set(&[1, 2]));
        // An unreadable component: two left of rs:2+1 prove nothing.
        let mut partial = chunks.clone();
        partial[0] = None;
        assert_eq!(current_in_stripe(&geo, data.len() as u64, 0, &partial, &set(&[1, 2])), set(&[]));
    }

    #[test]
    fn a_dissenting_suspect_is_found_only_when_the_bytes_can_tell() {
        // rs:2+1: one chunk differs; two suspects. Either could be the stale one: undecided.
        let geo = g("rs:2+1@4K");
        let old = bytes(1, 8192);
        let mut new = old.clone();
        new[10] ^= 0xff;
        let mut chunks = rs_chunks(&geo, &new);
        chunks[0] = rs_chunks(&geo, &old)[0].clone();
        assert_eq!(current_in_stripe(&geo, 8192, 0, &chunks, &set(&[0, 1])), set(&[]));
        // rs:4+2: one old chunk among three suspects: the other two agree with the rest.
        let geo = g("rs:4+2@4K");
        let old = bytes(3, 4 * 4096);
        let mut new = old.clone();
        new[4096 + 7] ^= 0x55;
        let mut chunks = rs_chunks(&geo, &new);
        chunks[1] = rs_chunks(&geo, &old)[1].clone();
        assert_eq!(current_in_stripe(&geo, new.len() as u64, 0, &chunks, &set(&[1, 3, 5])), set(&[3, 5]));
        // A suspect holding bytes past the file's end in its last stripe is never current.
        let geo = g("rs:2+1@4K");
        let data = bytes(4, 4096 + 100);
        let mut chunks = rs_chunks(&geo, &data);
        chunks[1].as_mut().unwrap()[200] = 9;
        assert!(!current_in_stripe(&geo, data.len() as u64, 0, &chunks, &set(&[1, 2])).contains(&1));
    }

    #[test]
    fn mirror_copies_that_agree_are_current() {
        let geo = g("mirror:2@4K");
        let a = bytes(5, 4096);
        let same = vec![Some(a.clone()), Some(a.clone())];
        assert_eq!(current_in_stripe(&geo, 4096, 0, &same, &set(&[0, 1])), set(&[0, 1]));
        let mut b = a.clone();
        b[0] ^= 1;
        let differ = vec![Some(a.clone()), Some(b.clone())];
        assert_eq!(current_in_stripe(&geo, 4096, 0, &differ, &set(&[0, 1])), set(&[]), "either could be right");
        let geo = g("mirror:3@4K");
        let three = vec![Some(a.clone()), Some(b), Some(a)];
        assert_eq!(current_in_stripe(&geo, 4096, 0, &three, &set(&[0, 1, 2])), set(&[0, 2]), "two of three agree");
    }
}
