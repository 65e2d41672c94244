//! Trace ids: one id for one user-level operation (an `open`, a `put`, a
//! kernel's read), carried from the client to the manager (`TRACED`,
//! manager protocol version 3) and to every drive request of the operation
//! (frame version 2, the header's `trace_len`), so the log lines of client,
//! manager and drives for that operation share it (docs/PROTOCOL.md,
//! "Trace ids").
//!
//! A trace id is 1..=[`TRACE_ID_LEN_MAX`] bytes of ASCII letters, digits,
//! `-`, `_` and `.`: safe to write into any log line as it is. It is a
//! label, not a secret and not a credential: it travels in the clear (also
//! under `PRIVACY_ARGS`), and only a MACed request binds it to its sender.

use crate::limits::TRACE_ID_LEN_MAX;
use crate::DecodeError;

/// A validated trace id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TraceId(String);

impl TraceId {
    /// Parses a trace id from its bytes: 1..=[`TRACE_ID_LEN_MAX`] of
    /// `[A-Za-z0-9._-]`, else an error naming what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.is_empty() {
            return Err(DecodeError::NotCanonical("empty trace id"));
        }
        if bytes.len() > TRACE_ID_LEN_MAX {
            return Err(DecodeError::OverLimit {
                field: "trace id",
                len: bytes.len() as u64,
                max: TRACE_ID_LEN_MAX as u64,
            });
        }
        if !bytes.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
            return Err(DecodeError::NotCanonical("trace id has a byte outside [A-Za-z0-9._-]"));
        }
        // Checked above: ASCII only.
        Ok(TraceId(String::from_utf8(bytes.to_vec()).expect("ASCII is UTF-8")))
    }

    /// The id nasd's clients make for an operation: 128 random bits as 32
    /// lowercase hexadecimal digits (the form of a W3C trace-context trace id).
    pub fn from_random(high: u64, low: u64) -> Self {
        TraceId(format!("{high:016x}{low:016x}"))
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id's bytes, as sent.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Display for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for TraceId {
    type Err = DecodeError;
    fn from_str(s: &str) -> Result<Self, DecodeError> {
        TraceId::from_bytes(s.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_id_is_short_plain_ascii() {
        let check = |s: &[u8], ok: bool| assert_eq!(TraceId::from_bytes(s).is_ok(), ok, "{s:?}");
        check(b"0123456789abcdef0123456789abcdef", true);
        check(b"A-b_c.9", true);
        check(&[b'a'; TRACE_ID_LEN_MAX], true);
        check(&[b'a'; TRACE_ID_LEN_MAX + 1], false);
        check(b"", false);
        for bad in [&b"a b"[..], b"a\nb", b"a\"b", b"a/b", b"\xc3\xa9", b"a\0"] {
            check(bad, false);
        }
        let id = TraceId::from_random(0x0123_4567_89ab_cdef, 1);
        assert_eq!(id.as_str(), "0123456789abcdef0000000000000001");
        assert_eq!(TraceId::from_bytes(id.as_bytes()).unwrap(), id);
    }
}
