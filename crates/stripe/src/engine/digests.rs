//! The stored digests of a striped object's data (`DIGESTS`), reading no
//! data: for each data column, the BLAKE3 digest every block of its
//! component object was stored with, as far as the column holds bytes of a
//! file of the given size.
//!
//! A mirror's column is asked of its copies in turn until one answers (the
//! copies hold the same bytes in the same blocks). A Reed-Solomon data
//! column that cannot answer is not rebuilt from parity (that would read
//! and hash the data): the call fails with [`StripeError::Unavailable`].
//! Parity is not consulted: it follows from the data.

use super::*;
use crate::request::TaskError;
use nasd_crypto::BlockDigest;

/// The stored digests of one data column's blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnDigests {
    /// The data column.
    pub column: usize,
    /// The block size of the drive that answered: the unit of the digests.
    pub block_size: u32,
    /// One digest per block of the column's component bytes under the
    /// object's size, in order: block `b` covers component bytes
    /// `[b·block_size, (b+1)·block_size)`, zeros past the component's end
    /// included. Blocks the component does not hold (holes, a component
    /// shorter than its column) have the digest of a block of zeros.
    pub digests: Vec<BlockDigest>,
}

/// One data column's progress.
struct Column {
    column: usize,
    /// The column's component bytes under the object's size.
    len: u64,
    /// The copy asked (a mirror's next copy is asked when one fails).
    copy: usize,
    /// The answers so far, with the block size of the drive that gave them.
    got: Option<ColumnDigests>,
    done: bool,
}

impl Column {
    /// Takes one answer (the digests from the block after those so far);
    /// whether the column is complete. Blocks at or past the component's
    /// end take the digest of a block of zeros, as they read.
    fn take(&mut self, block_size: u32, logical_size: u64, digests: Vec<BlockDigest>) -> bool {
        let bs = u64::from(block_size);
        let blocks = self.len.div_ceil(bs) as usize;
        let column = self.column;
        let got = self.got.get_or_insert_with(|| ColumnDigests { column, block_size, digests: Vec::new() });
        got.digests.extend(digests);
        let component_blocks = logical_size.div_ceil(bs);
        if got.digests.len() >= blocks || got.digests.len() as u64 >= component_blocks {
            got.digests.resize(blocks, nasd_crypto::zero_block_digest(bs as usize));
            return true;
        }
        false
    }
}

impl Striper {
    /// The stored digests of each data column's blocks for an object of
    /// `size` bytes (see [`ColumnDigests`]), from the drives' index alone
    /// (`DIGESTS`, at most `DIGESTS_MAX` blocks a request, all columns at
    /// once): no data is read or hashed, at the drives or here.
    ///
    /// # Errors
    /// [`StripeError::Unavailable`] if a data column has no copy that
    /// answers (parity is not used: rebuilding would read the data);
    /// [`StripeError::OutOfRange`] if `size` exceeds what the layout holds;
    /// binding errors.
    ///
    /// # Cancel safety
    /// Dropping the future aborts its requests; nothing is changed.
    pub async fn digests(&self, size: u64) -> Result<(Vec<ColumnDigests>, Report), StripeError> {
        let mut op = self.op()?;
        op.check_size(size)?;
        let g = op.g;
        let mut columns: Vec<Column> = (0..g.data_columns())
            .map(|column| {
                let len = g.component_len(size, g.data_component(column, 0));
                Column { column, len, copy: 0, got: None, done: len == 0 }
            })
            .collect();
        loop {
            let mut asked = Vec::new();
            for (i, col) in columns.iter_mut().enumerate().filter(|(_, c)| !c.done) {
                let copies = g.copies();
                let Some(comp) = (col.copy..copies).map(|r| g.data_component(col.column, r)).find(|&x| op.readable(x))
                else {
                    return Err(op.unavailable((0..copies).map(|r| g.data_component(col.column, r))));
                };
                col.copy = comp / g.data_columns();
                let from_block = col.got.as_ref().map_or(0, |d| d.digests.len() as u64);
                asked.push((i, comp, op.spawn(comp, Req::Digests { from_block, column_len: col.len })));
            }
            if asked.is_empty() {
                break;
            }
            for (i, comp, task) in asked {
                let col = &mut columns[i];
                match task.join_digests().await {
                    Ok((block_size, logical_size, digests)) => {
                        if col.got.as_ref().is_some_and(|d| d.block_size != block_size) {
                            return Err(StripeError::Bind(format!(
                                "component {comp} changed its block size during a digests request"
                            )));
                        }
                        col.done = col.take(block_size, logical_size, digests);
                    }
                    Err(TaskError::Component(cause)) => {
                        // The next copy starts over: its drive may cut other blocks.
                        op.record(comp, None, cause);
                        col.got = None;
                    }
                    Err(TaskError::Fatal(e)) => return Err(e),
                }
            }
        }
        Ok((columns.into_iter().filter_map(|c| c.got).collect(), op.report))
    }
}
