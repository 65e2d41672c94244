//! Where a striped object's bytes live: the mapping of `nasd_proto::layout`
//! as pure arithmetic, with no I/O.
//!
//! With `u` the stripe unit and `k` the data columns, file offset `x` lies
//! in stripe `s = x / (u·k)`, column `c = (x / u) mod k`, at component offset
//! `s·u + x mod u`. Mirror copy `r` of column `c` is component `r·k + c`;
//! Reed-Solomon data column `c` is component `c` and parity `j` is component
//! `k + j`. There is no parity rotation.
//!
//! Chunk lengths follow the file size: chunk (stripe `s`, column `c`) of a
//! file of `size` bytes holds `clamp(size − (s·u·k + c·u), 0, u)` bytes, and
//! the parity chunks of stripe `s` hold its column-0 chunk length rounded up
//! to [`RS_SHARD_ALIGN`], at most `u` (none for an empty stripe).

use nasd_proto::layout::{Layout, LayoutError, Scheme, RS_SHARD_ALIGN};
use nasd_proto::limits::OBJECT_SIZE_MAX;
use std::collections::BTreeSet;

/// Where one file byte lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// The stripe.
    pub stripe: u64,
    /// The data column.
    pub column: usize,
    /// The offset in the column's component objects.
    pub comp_offset: u64,
}

/// A run of file bytes that lie contiguously in one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// The stripe.
    pub stripe: u64,
    /// The data column.
    pub column: usize,
    /// Offset of the first byte in the column's component objects.
    pub comp_offset: u64,
    /// Offset of the first byte in the file.
    pub file_offset: u64,
    /// Bytes in the run (never zero).
    pub len: u64,
}

/// What a component object holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A data column (for a mirror, one copy of it; otherwise copy 0).
    Data {
        /// The column.
        column: usize,
        /// Which copy.
        copy: usize,
    },
    /// Reed-Solomon parity `index` of every stripe.
    Parity {
        /// The parity index `j` (component `k + j`).
        index: usize,
    },
}

/// The arithmetic of one layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    layout: Layout,
    unit: u64,
    columns: u64,
}

impl Geometry {
    /// The geometry of a valid layout.
    ///
    /// # Errors
    /// The layout breaks one of its bounds (`Layout::validate`).
    pub fn new(layout: Layout) -> Result<Geometry, LayoutError> {
        layout.validate()?;
        Ok(Geometry { layout, unit: layout.stripe_unit as u64, columns: layout.data_columns() as u64 })
    }

    /// The layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The stripe unit `u`, in bytes.
    pub fn unit(&self) -> u64 {
        self.unit
    }

    /// Data columns `k`.
    pub fn data_columns(&self) -> usize {
        self.columns as usize
    }

    /// Component objects.
    pub fn components(&self) -> usize {
        self.layout.components()
    }

    /// Copies of each data column (1 unless mirrored).
    pub fn copies(&self) -> usize {
        match self.layout.scheme {
            Scheme::Mirror { copies, .. } => copies as usize,
            _ => 1,
        }
    }

    /// Parity components per stripe (0 unless Reed-Solomon).
    pub fn parity(&self) -> usize {
        match self.layout.scheme {
            Scheme::ReedSolomon { parity, .. } => parity as usize,
            _ => 0,
        }
    }

    /// Bytes of file data in one full stripe (`u·k`).
    pub fn stripe_bytes(&self) -> u64 {
        self.unit * self.columns
    }

    /// One past the largest file offset the layout can hold: the offset
    /// whose component offset would reach `OBJECT_SIZE_MAX`.
    pub fn file_size_max(&self) -> u64 {
        // `u` divides OBJECT_SIZE_MAX (both powers of two), so this is
        // exactly the stripes that fit, each u·k bytes.
        (OBJECT_SIZE_MAX / self.unit) * self.stripe_bytes()
    }

    /// Where file byte `offset` lives.
    pub fn locate(&self, offset: u64) -> Location {
        let stripe = offset / self.stripe_bytes();
        let unit_index = offset / self.unit;
        Location {
            stripe,
            column: (unit_index % self.columns) as usize,
            comp_offset: stripe * self.unit + offset % self.unit,
        }
    }

    /// The file offset of byte `comp_offset` of data column `column` (the
    /// inverse of [`locate`](Self::locate)).
    pub fn file_offset(&self, column: usize, comp_offset: u64) -> u64 {
        assert!(column < self.data_columns(), "column {column} of {} columns", self.columns);
        let stripe = comp_offset / self.unit;
        stripe * self.stripe_bytes() + column as u64 * self.unit + comp_offset % self.unit
    }

    /// The file range `[offset, offset + len)` as runs within one chunk, in
    /// file order.
    pub fn extents(&self, offset: u64, len: u64) -> Extents {
        Extents { geometry: *self, next: offset, end: offset.saturating_add(len) }
    }

    /// Bytes chunk (`stripe`, `column`) holds in a file of `size` bytes.
    pub fn chunk_len(&self, size: u64, stripe: u64, column: usize) -> u64 {
        let start = stripe.saturating_mul(self.stripe_bytes()).saturating_add(column as u64 * self.unit);
        size.saturating_sub(start).min(self.unit)
    }

    /// Bytes each parity chunk of `stripe` holds in a file of `size` bytes:
    /// the column-0 chunk length rounded up to [`RS_SHARD_ALIGN`], at most
    /// `u` (0 for an empty stripe).
    pub fn parity_chunk_len(&self, size: u64, stripe: u64) -> u64 {
        let align = RS_SHARD_ALIGN as u64;
        self.chunk_len(size, stripe, 0).div_ceil(align).saturating_mul(align).min(self.unit)
    }

    /// Stripes holding at least one byte of a file of `size` bytes.
    pub fn stripes(&self, size: u64) -> u64 {
        size.div_ceil(self.stripe_bytes())
    }

    /// What component `component` holds.
    pub fn role(&self, component: usize) -> Role {
        assert!(component < self.components(), "component {component} of {}", self.components());
        let k = self.data_columns();
        if component < k * self.copies() {
            Role::Data { column: component % k, copy: component / k }
        } else {
            Role::Parity { index: component - k }
        }
    }

    /// The component holding copy `copy` of data column `column`.
    pub fn data_component(&self, column: usize, copy: usize) -> usize {
        assert!(column < self.data_columns() && copy < self.copies(), "column {column} copy {copy}");
        copy * self.data_columns() + column
    }

    /// The component holding parity `index`.
    pub fn parity_component(&self, index: usize) -> usize {
        assert!(index < self.parity(), "parity {index} of {}", self.parity());
        self.data_columns() + index
    }

    /// Bytes component `component` holds for a file of `size` bytes: its
    /// column's bytes for a data component (every mirror copy alike), the
    /// sum of the parity chunk lengths for a parity component.
    pub fn component_len(&self, size: u64, component: usize) -> u64 {
        let (u, sb) = (self.unit, self.stripe_bytes());
        match self.role(component) {
            Role::Data { column, .. } => {
                let full = size / sb;
                full * u + self.chunk_len(size, full, column)
            }
            Role::Parity { .. } if size == 0 => 0,
            Role::Parity { .. } => {
                let last = (size - 1) / sb;
                last * u + self.parity_chunk_len(size, last)
            }
        }
    }

    /// Whether every byte stays readable with the components in `lost`
    /// unavailable: no loss for a stripe, a surviving copy of every column
    /// for a mirror, at most `m` losses for Reed-Solomon.
    pub fn survives(&self, lost: &BTreeSet<usize>) -> bool {
        match self.layout.scheme {
            Scheme::Stripe { .. } => lost.is_empty(),
            Scheme::Mirror { .. } => {
                (0..self.data_columns()).all(|c| (0..self.copies()).any(|r| !lost.contains(&self.data_component(c, r))))
            }
            Scheme::ReedSolomon { parity, .. } => lost.len() <= parity as usize,
        }
    }
}

/// Iterator over the [`Extent`]s of a file range ([`Geometry::extents`]).
#[derive(Debug, Clone)]
pub struct Extents {
    geometry: Geometry,
    next: u64,
    end: u64,
}

impl Iterator for Extents {
    type Item = Extent;

    fn next(&mut self) -> Option<Extent> {
        if self.next >= self.end {
            return None;
        }
        let g = &self.geometry;
        let at = g.locate(self.next);
        let len = (g.unit - self.next % g.unit).min(self.end - self.next);
        let e =
            Extent { stripe: at.stripe, column: at.column, comp_offset: at.comp_offset, file_offset: self.next, len };
        self.next += len;
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn g(text: &str) -> Geometry {
        Geometry::new(Layout::parse(text).unwrap()).unwrap()
    }

    #[test]
    fn documented_examples() {
        let rs = g("rs:4+2@4K");
        let u = 4096;
        assert_eq!(rs.locate(0), Location { stripe: 0, column: 0, comp_offset: 0 });
        assert_eq!(rs.locate(u + 5), Location { stripe: 0, column: 1, comp_offset: 5 });
        assert_eq!(rs.locate(4 * u + 7), Location { stripe: 1, column: 0, comp_offset: u + 7 });
        assert_eq!(rs.locate(11 * u + 1), Location { stripe: 2, column: 3, comp_offset: 2 * u + 1 });
        assert_eq!(rs.role(5), Role::Parity { index: 1 });
        assert_eq!(rs.parity_component(0), 4);
        // A file ending 100 bytes into stripe 1, column 0.
        let size = 4 * u + 100;
        assert_eq!(rs.chunk_len(size, 1, 0), 100);
        assert_eq!(rs.chunk_len(size, 1, 1), 0);
        assert_eq!(rs.parity_chunk_len(size, 1), 128);
        assert_eq!(rs.parity_chunk_len(size, 0), u);
        assert_eq!(rs.parity_chunk_len(size, 2), 0);
        assert_eq!(rs.component_len(size, 0), u + 100);
        assert_eq!(rs.component_len(size, 3), u);
        assert_eq!(rs.component_len(size, 4), u + 128);
        assert_eq!(rs.component_len(0, 4), 0);

        let m = g("mirror:2x3@4K");
        assert_eq!(m.role(4), Role::Data { column: 1, copy: 1 });
        assert_eq!(m.data_component(2, 1), 5);
        assert_eq!(m.component_len(3 * u + 10, 3), u + 10);
        assert_eq!(m.component_len(3 * u + 10, 4), u);
    }

    #[test]
    fn survival_follows_the_scheme() {
        let set = |v: &[usize]| v.iter().copied().collect::<BTreeSet<_>>();
        let m = g("mirror:2x3");
        assert!(m.survives(&set(&[0, 4, 2])));
        assert!(!m.survives(&set(&[1, 4])));
        let rs = g("rs:4+2");
        assert!(rs.survives(&set(&[0, 5])));
        assert!(!rs.survives(&set(&[0, 1, 5])));
        assert!(!g("stripe:4").survives(&set(&[3])));
        assert!(g("stripe:4").survives(&set(&[])));
    }

    #[test]
    fn the_largest_file_ends_where_components_end() {
        for text in ["stripe:1@4K", "rs:4+2@1M", "mirror:3x2@16M"] {
            let g = g(text);
            let last = g.locate(g.file_size_max() - 1);
            assert_eq!(last.comp_offset, OBJECT_SIZE_MAX - 1, "{text}");
        }
    }

    fn layouts() -> impl Strategy<Value = Geometry> {
        let unit = prop_oneof![Just(4096u32), Just(8192), Just(65536)];
        let scheme = prop_oneof![
            (1u8..=6).prop_map(|width| Scheme::Stripe { width }),
            (1u8..=4, 2u8..=3).prop_map(|(width, copies)| Scheme::Mirror { width, copies }),
            (1u8..=6, 1u8..=3).prop_map(|(data, parity)| Scheme::ReedSolomon { data, parity }),
        ];
        (unit, scheme).prop_map(|(stripe_unit, scheme)| Geometry::new(Layout { stripe_unit, scheme }).unwrap())
    }

    proptest! {
        #[test]
        fn locate_and_file_offset_are_inverse(g in layouts(), x in 0u64..(1 << 40)) {
            let at = g.locate(x);
            prop_assert!(at.column < g.data_columns());
            prop_assert_eq!(at.comp_offset / g.unit(), at.stripe);
            prop_assert_eq!(g.file_offset(at.column, at.comp_offset), x);
        }

        #[test]
        fn data_bytes_map_one_to_one(g in layouts(), size in 0u64..200_000) {
            // Every (column, component offset) below the column's length is
            // hit by exactly one file byte below size, and nothing else is.
            let k = g.data_columns();
            let mut seen: Vec<Vec<bool>> =
                (0..k).map(|c| vec![false; g.component_len(size, c) as usize]).collect();
            for x in 0..size {
                let at = g.locate(x);
                let slot = seen[at.column].get_mut(at.comp_offset as usize);
                prop_assert!(slot.is_some(), "byte {} lands past its component's length", x);
                let slot = slot.unwrap();
                prop_assert!(!*slot, "two bytes land on one");
                *slot = true;
            }
            prop_assert!(seen.iter().all(|c| c.iter().all(|b| *b)));
        }

        #[test]
        fn extents_cover_exactly_the_range(g in layouts(), offset in 0u64..1_000_000, len in 0u64..500_000) {
            let mut at = offset;
            for e in g.extents(offset, len) {
                prop_assert_eq!(e.file_offset, at);
                prop_assert!(e.len > 0 && e.len <= g.unit());
                let l = g.locate(e.file_offset);
                prop_assert_eq!((l.stripe, l.column, l.comp_offset), (e.stripe, e.column, e.comp_offset));
                // The run stays in one unit.
                prop_assert_eq!(e.comp_offset / g.unit(), (e.comp_offset + e.len - 1) / g.unit());
                prop_assert_eq!(g.file_offset(e.column, e.comp_offset + e.len - 1), e.file_offset + e.len - 1);
                at += e.len;
            }
            prop_assert_eq!(at, offset + len);
        }

        #[test]
        fn component_len_agrees_with_extents(g in layouts(), size in 0u64..3_000_000) {
            let k = g.data_columns();
            let mut end = vec![0u64; k];
            let mut stripe_parity = std::collections::BTreeMap::new();
            for e in g.extents(0, size) {
                end[e.column] = end[e.column].max(e.comp_offset + e.len);
                let chunk = stripe_parity.entry(e.stripe).or_insert(0u64);
                if e.column == 0 {
                    *chunk += e.len;
                }
            }
            for c in 0..g.components() {
                let want = match g.role(c) {
                    Role::Data { column, .. } => end[column],
                    Role::Parity { .. } => match stripe_parity.iter().next_back() {
                        None => 0,
                        Some((&s, &col0)) => s * g.unit() + col0.div_ceil(64).saturating_mul(64).min(g.unit()),
                    },
                };
                prop_assert_eq!(g.component_len(size, c), want, "component {}", c);
            }
            for s in 0..g.stripes(size) {
                let sum: u64 = (0..k).map(|c| g.chunk_len(size, s, c)).sum();
                prop_assert!(sum > 0);
                prop_assert!(g.parity_chunk_len(size, s) >= g.chunk_len(size, s, 0));
                prop_assert_eq!(g.parity_chunk_len(size, s) % 64, 0);
            }
            prop_assert_eq!(g.chunk_len(size, g.stripes(size), 0), 0);
        }
    }
}
