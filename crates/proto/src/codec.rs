//! Canonical little-endian primitives shared by every message.
//!
//! There is exactly one encoding of each value: fixed-width integers, booleans
//! as 0 or 1, strings and byte strings as a `u16` length then the bytes, lists
//! as a `u16` count then the items. A decoder rejects anything else, including
//! trailing bytes, so the bytes a MAC covers are the bytes that were meant.

use crate::DecodeError;

/// Appends canonical encodings to a byte vector.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// A writer with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Self {
        Writer { buf: Vec::with_capacity(capacity) }
    }
    /// Appends one byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    /// Appends a little-endian `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a little-endian `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a little-endian `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a boolean as 0 or 1.
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(v as u8)
    }
    /// Appends raw bytes with no length prefix (fixed-size fields).
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    /// Appends a `u16` length then the bytes. Callers keep `v` within the
    /// field's named limit; a longer value is a programming error.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        let len = u16::try_from(v.len()).expect("length-prefixed field over u16::MAX");
        self.u16(len).raw(v)
    }
    /// Appends a UTF-8 string as length-prefixed bytes.
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
    /// The bytes written so far.
    pub fn into_vec(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads canonical encodings from a byte slice; every read is bounds-checked.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    /// Takes the next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Truncated)?;
        let out = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(out)
    }
    /// Reads a fixed-size array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    /// Reads one byte.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    /// Reads a little-endian `u16`.
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    /// Reads a little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    /// Reads a little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// Reads a boolean; any byte other than 0 or 1 is refused.
    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::NotCanonical("boolean other than 0 or 1")),
        }
    }
    /// Reads length-prefixed bytes of at most `max` bytes.
    pub fn bytes(&mut self, max: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let len = self.u16()? as usize;
        if len > max {
            return Err(DecodeError::OverLimit { field, len: len as u64, max: max as u64 });
        }
        self.take(len)
    }
    /// Reads a length-prefixed UTF-8 string of at most `max` bytes.
    pub fn str(&mut self, max: usize, field: &'static str) -> Result<String, DecodeError> {
        let raw = self.bytes(max, field)?;
        std::str::from_utf8(raw).map(str::to_owned).map_err(|_| DecodeError::NotCanonical("string is not UTF-8"))
    }
    /// Reads a `u16` list count and checks it against `max`.
    pub fn count(&mut self, max: usize, field: &'static str) -> Result<usize, DecodeError> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(DecodeError::OverLimit { field, len: n as u64, max: max as u64 });
        }
        Ok(n)
    }
    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// Succeeds only if every byte was consumed.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.remaining()))
        }
    }
}
