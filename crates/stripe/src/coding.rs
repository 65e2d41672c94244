//! Reed-Solomon coding of one stripe: `k` data shards to `m` parity shards,
//! and any `k` of the `k + m` back to the missing ones, over
//! `reed-solomon-simd` (Leopard-RS, GF(2^16)). Mirrors need no coding.
//!
//! Every shard of a stripe is as long as its parity chunks
//! ([`Geometry::parity_chunk_len`](crate::geometry::Geometry::parity_chunk_len));
//! a shorter data chunk counts as zero-padded to that length. The coder
//! works on 64-byte pieces of a shard independently of each other, so the
//! parity of a zero-extended stripe is its parity zero-extended — which is
//! why a stripe that grows keeps valid parity in its old bytes, and why
//! shard lengths are multiples of [`RS_SHARD_ALIGN`].

use nasd_proto::layout::RS_SHARD_ALIGN;
use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};
use thiserror::Error;

/// The piece size `reed-solomon-simd` codes independently (its shards must
/// be even; shards that are multiples of 64 code piece by piece, which is
/// what makes zero extension preserve parity).
const CODER_PIECE_LEN: u32 = 64;
#[allow(clippy::manual_is_multiple_of)] // is_multiple_of is newer than the workspace's rust-version
const _: () = assert!(RS_SHARD_ALIGN % CODER_PIECE_LEN == 0);

/// Why coding failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CodingError {
    /// Fewer than `k` shards of the stripe are present.
    #[error("{present} shards present, {needed} needed to reconstruct")]
    NotEnoughShards {
        /// Shards given.
        present: usize,
        /// Shards needed (`k`).
        needed: usize,
    },
    /// The shards do not fit the coder (a shard longer than the shard
    /// length, a count the coder does not support).
    #[error("shards do not fit the coder: {0}")]
    Shape(String),
}

/// Encoder and decoder of one `k + m` Reed-Solomon code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coder {
    data: usize,
    parity: usize,
}

impl Coder {
    /// A coder for `data` data shards and `parity` parity shards.
    ///
    /// # Errors
    /// [`CodingError::Shape`] if the coder does not support the counts (any
    /// layout `Layout::validate` accepts is supported).
    pub fn new(data: usize, parity: usize) -> Result<Coder, CodingError> {
        if data == 0 || parity == 0 || !ReedSolomonEncoder::supports(data, parity) {
            return Err(CodingError::Shape(format!("{data}+{parity} is not a supported code")));
        }
        Ok(Coder { data, parity })
    }

    /// Data shards `k`.
    pub fn data(&self) -> usize {
        self.data
    }

    /// Parity shards `m`.
    pub fn parity(&self) -> usize {
        self.parity
    }

    fn check_len(shard_len: usize) -> Result<(), CodingError> {
        #[allow(clippy::manual_is_multiple_of)] // newer than the workspace's rust-version
        if shard_len % RS_SHARD_ALIGN as usize != 0 {
            return Err(CodingError::Shape(format!("shard length {shard_len} is not a multiple of {RS_SHARD_ALIGN}")));
        }
        Ok(())
    }

    /// The `m` parity shards, each `shard_len` bytes, of the `k` data shards
    /// in `data` (each at most `shard_len` bytes, zero-padded to it).
    /// `shard_len` 0 (an empty stripe) gives empty parity shards.
    ///
    /// # Errors
    /// [`CodingError::Shape`]: not `k` data shards, one longer than
    /// `shard_len`, or `shard_len` not a multiple of [`RS_SHARD_ALIGN`].
    pub fn encode<T: AsRef<[u8]>>(&self, data: &[T], shard_len: usize) -> Result<Vec<Vec<u8>>, CodingError> {
        let mut parity = vec![Vec::new(); self.parity];
        self.encoder().encode_into(data, shard_len, |j, shard| parity[j] = shard.to_vec())?;
        Ok(parity)
    }

    /// An encoder for many stripes of this code, its working space
    /// allocated once (a new encoder per stripe allocated and zeroed it
    /// every time: `nasd bench cost` found it among the client's copies).
    pub fn encoder(&self) -> StripeEncoder {
        StripeEncoder { coder: *self, inner: None, padded: Vec::new() }
    }

    /// Fills the missing data shards of `shards` (`k + m` entries: data
    /// shards `0..k`, then parity shards; `None` where missing). Present
    /// data shards may be shorter than `shard_len` (zero-padded); present
    /// parity shards must be exactly `shard_len`. Restored data shards are
    /// `shard_len` bytes. With `parity_too`, missing parity shards are
    /// recomputed as well.
    ///
    /// # Errors
    /// [`CodingError::NotEnoughShards`] if fewer than `k` are present;
    /// [`CodingError::Shape`] for shards of the wrong count or length.
    pub fn reconstruct(
        &self,
        shards: &mut [Option<Vec<u8>>],
        shard_len: usize,
        parity_too: bool,
    ) -> Result<(), CodingError> {
        Self::check_len(shard_len)?;
        let (k, m) = (self.data, self.parity);
        if shards.len() != k + m {
            return Err(CodingError::Shape(format!("{} shards for a {k}+{m} code", shards.len())));
        }
        let present = shards.iter().filter(|s| s.is_some()).count();
        if present < k {
            return Err(CodingError::NotEnoughShards { present, needed: k });
        }
        for (i, s) in shards.iter().enumerate() {
            let len = s.as_ref().map_or(0, Vec::len);
            if len > shard_len || (i >= k && s.is_some() && len != shard_len) {
                return Err(CodingError::Shape(format!("shard {i} is {len} bytes, the shard length is {shard_len}")));
            }
        }
        let data_missing = shards[..k].iter().any(Option::is_none);
        if data_missing {
            if shard_len == 0 {
                shards[..k].iter_mut().for_each(|s| *s = Some(s.take().unwrap_or_default()));
            } else {
                self.decode(shards, shard_len)?;
            }
        }
        if parity_too && shards[k..].iter().any(Option::is_none) {
            let data: Vec<&Vec<u8>> = shards[..k].iter().map(|s| s.as_ref().expect("data restored above")).collect();
            let parity = self.encode(&data, shard_len)?;
            for (slot, p) in shards[k..].iter_mut().zip(parity) {
                slot.get_or_insert(p);
            }
        }
        Ok(())
    }

    fn decode(&self, shards: &mut [Option<Vec<u8>>], shard_len: usize) -> Result<(), CodingError> {
        let k = self.data;
        let mut decoder = ReedSolomonDecoder::new(k, self.parity, shard_len).map_err(shape)?;
        let mut used = 0;
        // Exactly k shards: the decoder needs no more, and fewer inputs are less work.
        for (i, s) in shards.iter_mut().enumerate() {
            let Some(s) = s.as_mut().filter(|_| used < k) else { continue };
            used += 1;
            if i < k {
                s.resize(shard_len, 0);
                decoder.add_original_shard(i, &s[..]).map_err(shape)?;
            } else {
                decoder.add_recovery_shard(i - k, &s[..]).map_err(shape)?;
            }
        }
        let result = decoder.decode().map_err(shape)?;
        let restored: Vec<(usize, Vec<u8>)> = result.restored_original_iter().map(|(i, d)| (i, d.to_vec())).collect();
        for (i, d) in restored {
            assert!(i < k && d.len() == shard_len, "the decoder restores data shards of the shard length");
            shards[i].get_or_insert(d);
        }
        // A data shard past the first k present ones was not given to the
        // decoder; it is present all the same. Every data shard is now.
        assert!(shards[..k].iter().all(Option::is_some), "decoding restores every missing data shard");
        Ok(())
    }
}

/// [`Coder::encode`] for one stripe after another with one working space.
pub struct StripeEncoder {
    coder: Coder,
    inner: Option<(ReedSolomonEncoder, usize)>,
    padded: Vec<u8>,
}

impl StripeEncoder {
    /// The `m` parity shards of the `k` data shards in `data` (each at most
    /// `shard_len` bytes, zero-padded to it), each handed to `out` with its
    /// index `j` (`0..m`) as it is made, for the caller to copy where it
    /// belongs. `shard_len` 0 hands over `m` empty shards.
    ///
    /// # Errors
    /// As [`Coder::encode`].
    pub fn encode_into<T: AsRef<[u8]>>(
        &mut self,
        data: &[T],
        shard_len: usize,
        mut out: impl FnMut(usize, &[u8]),
    ) -> Result<(), CodingError> {
        let Coder { data: k, parity: m } = self.coder;
        Coder::check_len(shard_len)?;
        if data.len() != k {
            return Err(CodingError::Shape(format!("{} data shards for a {k}-shard code", data.len())));
        }
        if let Some(long) = data.iter().map(|d| d.as_ref().len()).find(|&l| l > shard_len) {
            return Err(CodingError::Shape(format!("a {long}-byte data shard exceeds the shard length {shard_len}")));
        }
        if shard_len == 0 {
            (0..m).for_each(|j| out(j, &[]));
            return Ok(());
        }
        let Self { inner, padded, .. } = self;
        let encoder = match inner {
            Some((encoder, len)) if *len == shard_len => encoder,
            Some((encoder, len)) => {
                encoder.reset(k, m, shard_len).map_err(shape)?;
                *len = shard_len;
                encoder
            }
            None => &mut inner.insert((ReedSolomonEncoder::new(k, m, shard_len).map_err(shape)?, shard_len)).0,
        };
        let added = data.iter().try_for_each(|d| {
            let d = d.as_ref();
            if d.len() == shard_len {
                encoder.add_original_shard(d)
            } else {
                padded.clear();
                padded.extend_from_slice(d);
                padded.resize(shard_len, 0);
                encoder.add_original_shard(&*padded)
            }
        });
        let encoded = added.and_then(|()| {
            let result = encoder.encode()?;
            result.recovery_iter().enumerate().for_each(|(j, shard)| out(j, shard));
            Ok(())
        });
        if let Err(e) = encoded {
            // Shards half added would be counted in the next stripe: start afresh.
            *inner = None;
            return Err(shape(e));
        }
        Ok(())
    }
}

fn shape(e: reed_solomon_simd::Error) -> CodingError {
    CodingError::Shape(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shards(k: usize, len: usize, seed: u8) -> Vec<Vec<u8>> {
        (0..k)
            .map(|i| {
                (0..len).map(|j| (j as u8).wrapping_mul(31).wrapping_add(i as u8 * 17).wrapping_add(seed)).collect()
            })
            .collect()
    }

    /// Every subset of at most `m` lost shards of a `k + m` stripe.
    fn check_all_losses(k: usize, m: usize, len: usize) {
        let coder = Coder::new(k, m).unwrap();
        let data = shards(k, len, k as u8);
        let parity = coder.encode(&data, len).unwrap();
        assert_eq!(parity.len(), m);
        let all: Vec<Vec<u8>> = data.iter().chain(&parity).cloned().collect();
        let n = k + m;
        for lost in 0u32..(1 << n) {
            if lost.count_ones() as usize > m {
                continue;
            }
            let mut s: Vec<Option<Vec<u8>>> =
                all.iter().enumerate().map(|(i, d)| (lost & (1 << i) == 0).then(|| d.clone())).collect();
            coder.reconstruct(&mut s, len, true).unwrap_or_else(|e| panic!("{k}+{m} lost {lost:b}: {e}"));
            for (i, d) in all.iter().enumerate() {
                assert_eq!(s[i].as_ref(), Some(d), "{k}+{m} lost {lost:b}: shard {i}");
            }
        }
    }

    #[test]
    fn small_codes_reconstruct_every_loss_exactly() {
        for (k, m) in [(1, 1), (1, 2), (2, 1), (2, 2), (3, 2), (4, 2), (4, 3), (5, 3), (6, 2)] {
            check_all_losses(k, m, 192);
        }
    }

    #[test]
    fn larger_codes_reconstruct_sampled_losses() {
        // 10+4 and 16+4: too many subsets to try all; a deterministic sample.
        for (k, m) in [(10usize, 4usize), (16, 4), (8, 8)] {
            let coder = Coder::new(k, m).unwrap();
            let len = 4096;
            let data = shards(k, len, 3);
            let parity = coder.encode(&data, len).unwrap();
            let all: Vec<Vec<u8>> = data.iter().chain(&parity).cloned().collect();
            let mut x = 0x2545_f491_4f6c_dd1du64;
            for _ in 0..40 {
                let mut lost = std::collections::BTreeSet::new();
                while lost.len() < m {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    lost.insert((x % (k + m) as u64) as usize);
                }
                let mut s: Vec<Option<Vec<u8>>> =
                    all.iter().enumerate().map(|(i, d)| (!lost.contains(&i)).then(|| d.clone())).collect();
                coder.reconstruct(&mut s, len, true).unwrap();
                assert!(s.iter().zip(&all).all(|(a, b)| a.as_ref() == Some(b)), "{k}+{m} lost {lost:?}");
            }
        }
    }

    #[test]
    fn short_data_shards_count_as_zero_padded() {
        let coder = Coder::new(3, 2).unwrap();
        let short = vec![vec![7u8; 100], vec![9u8; 5], Vec::new()];
        let padded: Vec<Vec<u8>> = short.iter().map(|s| [&s[..], &vec![0; 128 - s.len()][..]].concat()).collect();
        assert_eq!(coder.encode(&short, 128).unwrap(), coder.encode(&padded, 128).unwrap());
        let parity = coder.encode(&short, 128).unwrap();
        let mut s = vec![None, Some(short[1].clone()), Some(short[2].clone()), Some(parity[0].clone()), None];
        coder.reconstruct(&mut s, 128, false).unwrap();
        assert_eq!(s[0].as_deref(), Some(&padded[0][..]));
        assert!(s[4].is_none(), "parity is left alone unless asked");
    }

    #[test]
    fn zero_extension_keeps_parity() {
        // A stripe that grows (its shard length rising from 128 to 4096, the
        // new bytes zero) keeps its old parity bytes: what lets a growing
        // file leave earlier stripes' parity as written.
        let coder = Coder::new(4, 2).unwrap();
        let data = shards(4, 128, 1);
        let short = coder.encode(&data, 128).unwrap();
        let long = coder.encode(&data, 4096).unwrap();
        for (s, l) in short.iter().zip(&long) {
            assert_eq!(&l[..128], &s[..]);
            assert!(l[128..].iter().all(|b| *b == 0));
        }
    }

    #[test]
    fn bad_shapes_are_errors_not_panics() {
        let coder = Coder::new(2, 1).unwrap();
        assert!(matches!(coder.encode(&[vec![0u8; 64]], 64), Err(CodingError::Shape(_))));
        assert!(matches!(coder.encode(&[vec![0u8; 65], vec![]], 64), Err(CodingError::Shape(_))));
        assert!(matches!(coder.encode(&[vec![0u8; 10], vec![]], 10), Err(CodingError::Shape(_))));
        let mut s = vec![Some(vec![0u8; 64]), None, None];
        assert_eq!(coder.reconstruct(&mut s, 64, false), Err(CodingError::NotEnoughShards { present: 1, needed: 2 }));
        let mut s = vec![Some(vec![0u8; 64]), None, Some(vec![0u8; 32])];
        assert!(matches!(coder.reconstruct(&mut s, 64, false), Err(CodingError::Shape(_))));
        assert!(Coder::new(0, 1).is_err());
        assert_eq!(coder.encode(&[Vec::<u8>::new(), Vec::new()], 0).unwrap(), vec![Vec::<u8>::new()]);
    }
}
