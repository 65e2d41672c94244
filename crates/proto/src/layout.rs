//! How a regular file's bytes are spread over drive objects: its [`Layout`]
//! (stripe unit and redundancy scheme) and its component objects.
//!
//! A file of layout `L` has `L.components()` component objects, each on a
//! different drive. Its bytes are cut into **stripe units** of
//! `L.stripe_unit` bytes laid round-robin over `L.data_columns()` data
//! columns; a **stripe** is one unit of every column. For file offset `x`,
//! with `u` the stripe unit and `k` the data columns:
//!
//! ```text
//! stripe s = x / (u·k)      column c = (x / u) mod k      component offset = s·u + x mod u
//! ```
//!
//! Which component holds column `c`:
//! - [`Scheme::Stripe`] (RAID 0): component `c`.
//! - [`Scheme::Mirror`] (RAID 1/10): copy `r` of column `c` is component
//!   `r·width + c`; every copy holds the same bytes at the same offsets.
//! - [`Scheme::ReedSolomon`] (k+m): data column `c` is component `c`; parity
//!   `j` of the stripe is component `k + j`, at the same component offset
//!   `s·u`. The parity chunks of stripe `s` are as long as its column-0
//!   chunk (the longest), rounded up to [`RS_SHARD_ALIGN`] and at most `u`;
//!   shorter data chunks count as zero-padded to that length.
//!
//! Today's single-object file is `stripe:1` (one component).

use crate::codec::{Reader, Writer};
use crate::fs::ObjectRef;
use crate::DecodeError;

/// Smallest stripe unit, in bytes (a power of two).
pub const STRIPE_UNIT_MIN: u32 = 4096;
/// Largest stripe unit, in bytes (a power of two). A client buffers at most
/// one stripe per column in flight per file, so this bounds that memory.
pub const STRIPE_UNIT_MAX: u32 = 16 * 1024 * 1024;
/// Default stripe unit, in bytes.
pub const STRIPE_UNIT_DEFAULT: u32 = 1024 * 1024;
/// Most data columns of a layout (stripe width, mirror width, RS data `k`).
pub const DATA_COLUMNS_MAX: u8 = 32;
/// Most copies of a mirrored layout.
pub const MIRROR_COPIES_MAX: u8 = 4;
/// Most parity components of a Reed-Solomon layout.
pub const PARITY_MAX: u8 = 8;
/// Most component objects of one file. A lookup reply carries a capability
/// for each (at most ~850 bytes apiece).
pub const COMPONENTS_MAX: usize = 64;
/// Parity chunk lengths are multiples of this many bytes (what the
/// Reed-Solomon coder needs of a shard).
pub const RS_SHARD_ALIGN: u32 = 64;

const _: () = assert!(STRIPE_UNIT_MIN.is_power_of_two() && STRIPE_UNIT_MAX.is_power_of_two());
const _: () = assert!(STRIPE_UNIT_MIN <= STRIPE_UNIT_DEFAULT && STRIPE_UNIT_DEFAULT <= STRIPE_UNIT_MAX);
const _: () = assert!(STRIPE_UNIT_MIN.is_multiple_of(RS_SHARD_ALIGN));
const _: () = assert!(DATA_COLUMNS_MAX as usize * MIRROR_COPIES_MAX as usize <= 128);

/// The redundancy scheme of a layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// RAID 0: `width` columns, no redundancy.
    Stripe {
        /// Data columns (1..=[`DATA_COLUMNS_MAX`]).
        width: u8,
    },
    /// RAID 1/10: `width` columns, each stored `copies` times.
    Mirror {
        /// Data columns (1..=[`DATA_COLUMNS_MAX`]).
        width: u8,
        /// Copies of each column (2..=[`MIRROR_COPIES_MAX`]).
        copies: u8,
    },
    /// Reed-Solomon: `data` columns and `parity` parity components per
    /// stripe; any `data` of the `data + parity` chunks rebuild the stripe.
    ReedSolomon {
        /// Data columns k (1..=[`DATA_COLUMNS_MAX`]).
        data: u8,
        /// Parity components m (1..=[`PARITY_MAX`]).
        parity: u8,
    },
}

/// How a file's bytes are spread over component objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    /// Bytes per stripe unit: a power of two in
    /// [`STRIPE_UNIT_MIN`]..=[`STRIPE_UNIT_MAX`].
    pub stripe_unit: u32,
    /// Redundancy.
    pub scheme: Scheme,
}

/// Why a layout is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutError(pub String);

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LayoutError {}

fn bad<T>(msg: impl Into<String>) -> Result<T, LayoutError> {
    Err(LayoutError(msg.into()))
}

impl Layout {
    /// Encoded length: `stripe_unit u32`, `scheme u8`, two `u8` parameters.
    pub const LEN: usize = 7;

    /// One object, no redundancy (what every file was before layouts).
    pub const SINGLE: Layout = Layout { stripe_unit: STRIPE_UNIT_DEFAULT, scheme: Scheme::Stripe { width: 1 } };

    /// Checks every bound of the layout.
    ///
    /// # Errors
    /// A message naming the bound broken.
    pub fn validate(&self) -> Result<(), LayoutError> {
        let u = self.stripe_unit;
        if !u.is_power_of_two() || !(STRIPE_UNIT_MIN..=STRIPE_UNIT_MAX).contains(&u) {
            return bad(format!(
                "stripe unit {u} must be a power of two from {STRIPE_UNIT_MIN} to {STRIPE_UNIT_MAX} bytes"
            ));
        }
        let columns = |n: u8| {
            if (1..=DATA_COLUMNS_MAX).contains(&n) {
                Ok(())
            } else {
                bad(format!("{n} data columns: must be 1..={DATA_COLUMNS_MAX}"))
            }
        };
        match self.scheme {
            Scheme::Stripe { width } => columns(width)?,
            Scheme::Mirror { width, copies } => {
                columns(width)?;
                if !(2..=MIRROR_COPIES_MAX).contains(&copies) {
                    return bad(format!("{copies} mirror copies: must be 2..={MIRROR_COPIES_MAX}"));
                }
            }
            Scheme::ReedSolomon { data, parity } => {
                columns(data)?;
                if !(1..=PARITY_MAX).contains(&parity) {
                    return bad(format!("{parity} parity components: must be 1..={PARITY_MAX}"));
                }
            }
        }
        if self.components() > COMPONENTS_MAX {
            return bad(format!("{} component objects: at most {COMPONENTS_MAX}", self.components()));
        }
        Ok(())
    }

    /// Data columns `k` per stripe.
    pub fn data_columns(&self) -> usize {
        match self.scheme {
            Scheme::Stripe { width } | Scheme::Mirror { width, .. } => width as usize,
            Scheme::ReedSolomon { data, .. } => data as usize,
        }
    }

    /// Component objects a file of this layout has.
    pub fn components(&self) -> usize {
        match self.scheme {
            Scheme::Stripe { width } => width as usize,
            Scheme::Mirror { width, copies } => width as usize * copies as usize,
            Scheme::ReedSolomon { data, parity } => data as usize + parity as usize,
        }
    }

    /// How many components may be lost with every byte still readable.
    pub fn tolerates(&self) -> usize {
        match self.scheme {
            Scheme::Stripe { .. } => 0,
            Scheme::Mirror { copies, .. } => copies as usize - 1,
            Scheme::ReedSolomon { parity, .. } => parity as usize,
        }
    }

    /// Bytes of file data in one full stripe.
    pub fn stripe_bytes(&self) -> u64 {
        self.stripe_unit as u64 * self.data_columns() as u64
    }

    /// Whether the layout keeps redundant data (mirror or parity).
    pub fn is_redundant(&self) -> bool {
        self.tolerates() > 0
    }

    /// Appends the canonical encoding.
    pub fn encode(&self, w: &mut Writer) {
        let (code, a, b) = match self.scheme {
            Scheme::Stripe { width } => (1, width, 0),
            Scheme::Mirror { width, copies } => (2, width, copies),
            Scheme::ReedSolomon { data, parity } => (3, data, parity),
        };
        w.u32(self.stripe_unit).u8(code).u8(a).u8(b);
    }

    /// Reads and validates the canonical encoding.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let stripe_unit = r.u32()?;
        let (code, a, b) = (r.u8()?, r.u8()?, r.u8()?);
        let scheme = match code {
            1 if b == 0 => Scheme::Stripe { width: a },
            2 => Scheme::Mirror { width: a, copies: b },
            3 => Scheme::ReedSolomon { data: a, parity: b },
            _ => return Err(DecodeError::NotCanonical("unknown layout scheme")),
        };
        let layout = Layout { stripe_unit, scheme };
        layout.validate().map_err(|_| DecodeError::NotCanonical("layout out of bounds"))?;
        Ok(layout)
    }

    /// Parses the text form [`Display`](std::fmt::Display) writes:
    /// `stripe:W`, `mirror:C` (width 1) or `mirror:CxW`, `rs:K+M`, each
    /// optionally followed by `@UNIT` with `UNIT` in bytes or with a `K`/`M`
    /// (KiB, MiB) suffix. Examples: `rs:2+1`, `mirror:2x4@256K`, `stripe:8@1M`.
    ///
    /// # Errors
    /// A message saying what is wrong.
    pub fn parse(text: &str) -> Result<Layout, LayoutError> {
        let (spec, unit) = match text.split_once('@') {
            Some((spec, unit)) => (spec, parse_unit(unit)?),
            None => (text, STRIPE_UNIT_DEFAULT),
        };
        let num = |s: &str| s.trim().parse::<u8>().map_err(|_| LayoutError(format!("'{s}' is not a small number")));
        let scheme = match spec.trim().split_once(':') {
            Some(("stripe", w)) => Scheme::Stripe { width: num(w)? },
            Some(("mirror", n)) => match n.split_once('x') {
                Some((copies, width)) => Scheme::Mirror { width: num(width)?, copies: num(copies)? },
                None => Scheme::Mirror { width: 1, copies: num(n)? },
            },
            Some(("rs", km)) => match km.split_once('+') {
                Some((k, m)) => Scheme::ReedSolomon { data: num(k)?, parity: num(m)? },
                None => return bad(format!("'{text}': write Reed-Solomon as rs:K+M, e.g. rs:4+2")),
            },
            _ => {
                return bad(format!(
                    "'{text}' is not a layout: use stripe:W, mirror:C, mirror:CxW or rs:K+M, optionally @UNIT (e.g. rs:2+1@1M)"
                ))
            }
        };
        let layout = Layout { stripe_unit: unit, scheme };
        layout.validate()?;
        Ok(layout)
    }
}

fn parse_unit(s: &str) -> Result<u32, LayoutError> {
    let s = s.trim();
    let (digits, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1024u64),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1024 * 1024),
        _ => (s, 1),
    };
    let n: u64 = digits.parse().map_err(|_| LayoutError(format!("'{s}' is not a stripe unit (e.g. 64K, 1M)")))?;
    u32::try_from(n.saturating_mul(mult)).map_err(|_| LayoutError(format!("stripe unit '{s}' is too large")))
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.scheme {
            Scheme::Stripe { width } => write!(f, "stripe:{width}")?,
            Scheme::Mirror { width: 1, copies } => write!(f, "mirror:{copies}")?,
            Scheme::Mirror { width, copies } => write!(f, "mirror:{copies}x{width}")?,
            Scheme::ReedSolomon { data, parity } => write!(f, "rs:{data}+{parity}")?,
        }
        let u = self.stripe_unit;
        if u.is_multiple_of(1024 * 1024) {
            write!(f, "@{}M", u / (1024 * 1024))
        } else if u.is_multiple_of(1024) {
            write!(f, "@{}K", u / 1024)
        } else {
            write!(f, "@{u}")
        }
    }
}

/// Whether a component may be read, as the manager knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ComponentState {
    /// Holds current data.
    Ok = 0,
    /// Missed writes (its drive was down during a write, or it is being
    /// rebuilt): do not read it; write to it if its drive answers.
    Stale = 1,
    /// Its drive is down (missed heartbeats): neither read nor write it.
    Down = 2,
}

impl ComponentState {
    /// The wire byte.
    pub fn code(self) -> u8 {
        self as u8
    }
    /// Parses the wire byte.
    pub fn from_code(code: u8) -> Result<Self, DecodeError> {
        match code {
            0 => Ok(ComponentState::Ok),
            1 => Ok(ComponentState::Stale),
            2 => Ok(ComponentState::Down),
            _ => Err(DecodeError::NotCanonical("unknown component state")),
        }
    }
    /// Whether the component may be read.
    pub fn readable(self) -> bool {
        self == ComponentState::Ok
    }
}

/// One component object of a file and its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Component {
    /// The object.
    pub object: ObjectRef,
    /// Whether it may be read.
    pub state: ComponentState,
}

impl Component {
    /// Encoded length.
    pub const LEN: usize = ObjectRef::LEN + 1;
    /// Appends the canonical encoding: `ObjectRef`, `state u8`.
    pub fn encode(&self, w: &mut Writer) {
        self.object.encode(w);
        w.u8(self.state.code());
    }
    /// Reads the canonical encoding.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Component { object: ObjectRef::decode(r)?, state: ComponentState::from_code(r.u8()?)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips() {
        for text in ["stripe:1@1M", "stripe:8@64K", "mirror:2@1M", "mirror:3x4@256K", "rs:2+1@1M", "rs:10+4@4M"] {
            let l = Layout::parse(text).unwrap();
            assert_eq!(l.to_string(), text);
            let mut w = Writer::with_capacity(Layout::LEN);
            l.encode(&mut w);
            let bytes = w.into_vec();
            assert_eq!(bytes.len(), Layout::LEN);
            let mut r = Reader::new(&bytes);
            assert_eq!(Layout::decode(&mut r).unwrap(), l);
        }
        assert_eq!(Layout::parse("rs:2+1").unwrap().stripe_unit, STRIPE_UNIT_DEFAULT);
    }

    #[test]
    fn out_of_bounds_layouts_are_refused() {
        for text in ["stripe:0", "stripe:33", "mirror:1", "mirror:5", "rs:2+0", "rs:2+9", "rs:33+1", "stripe:2@3000"] {
            assert!(Layout::parse(text).is_err(), "{text}");
        }
        assert!(Layout::parse("mirror:4x32").is_err(), "128 components");
        assert!(Layout::parse("stripe:2@32M").is_err());
        assert!(Layout::parse("raid5").is_err());
    }

    #[test]
    fn counts_follow_the_scheme() {
        let rs = Layout::parse("rs:4+2").unwrap();
        assert_eq!((rs.data_columns(), rs.components(), rs.tolerates()), (4, 6, 2));
        let m = Layout::parse("mirror:2x3").unwrap();
        assert_eq!((m.data_columns(), m.components(), m.tolerates()), (3, 6, 1));
        assert_eq!(Layout::SINGLE.components(), 1);
        assert!(!Layout::SINGLE.is_redundant());
    }

    #[test]
    fn non_canonical_encodings_are_refused() {
        for bytes in [[0, 0, 16, 0, 1, 2, 1], [0, 0, 16, 0, 9, 2, 1], [0, 0, 16, 0, 2, 1, 1]] {
            assert!(Layout::decode(&mut Reader::new(&bytes)).is_err(), "{bytes:?}");
        }
    }
}
