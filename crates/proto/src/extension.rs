//! The argument encodings of the drive extensions nasd ships (PROTOCOL.md,
//! "Extensions"). An extension is called with [`crate::Request::Extension`]:
//! its name (as `inquiry` lists it, the version in the name) and an argument
//! block only the extension reads, decoded here with the same canonical
//! codec as every other message.

use crate::codec::{Reader, Writer};
use crate::limits::PREFETCH_HINTS_PER_CALL_MAX;
use crate::{DecodeError, Region};

/// Informed prefetching (NASD §3.4, §4.6): a client tells the drive which
/// regions of an object it will read, in order; the drive reads them from
/// its disk into a bounded cache ahead of the client, paced by the progress
/// the client reports.
pub const PREFETCH: &str = "prefetch-v1";

/// One `prefetch-v1` call. Hints form a numbered stream the client chose
/// the id of; a stream may span objects (each call carries the capability
/// of its own object). PROTOCOL.md documents each field.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefetchCall {
    /// Future reads of the call's object, each with its number in the
    /// stream (the order the client will make them in; one read of the
    /// client may be several hints, on several objects, of one number).
    Hint { stream: u64, hints: Vec<ReadHint> },
    /// The client has made every read numbered `through_seq` or lower: the
    /// drive may drop what it holds for them.
    Progress { stream: u64, through_seq: u32 },
    /// The client is done with the stream: everything for it is dropped.
    End { stream: u64 },
}

/// One hinted read: its number in the stream and the object's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadHint {
    /// The read's number in the stream.
    pub seq: u32,
    /// The bytes of the object it reads.
    pub region: Region,
}

const HINT: u8 = 1;
const PROGRESS: u8 = 2;
const END: u8 = 3;

impl PrefetchCall {
    /// The canonical argument block.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            PrefetchCall::Hint { stream, hints } => {
                assert!(hints.len() <= PREFETCH_HINTS_PER_CALL_MAX, "hints over PREFETCH_HINTS_PER_CALL_MAX");
                w.u8(HINT).u64(*stream).u16(hints.len() as u16);
                for h in hints {
                    w.u32(h.seq).u64(h.region.offset).u64(h.region.length);
                }
            }
            PrefetchCall::Progress { stream, through_seq } => {
                w.u8(PROGRESS).u64(*stream).u32(*through_seq);
            }
            PrefetchCall::End { stream } => {
                w.u8(END).u64(*stream);
            }
        }
        w.into_vec()
    }

    /// Decodes an argument block; rejects unknown calls, over-limit counts
    /// and trailing bytes.
    pub fn decode(args: &[u8]) -> Result<PrefetchCall, DecodeError> {
        let mut r = Reader::new(args);
        let call = match r.u8()? {
            HINT => {
                let stream = r.u64()?;
                let n = r.count(PREFETCH_HINTS_PER_CALL_MAX, "prefetch hints")?;
                let hints = (0..n)
                    .map(|_| Ok(ReadHint { seq: r.u32()?, region: Region { offset: r.u64()?, length: r.u64()? } }))
                    .collect::<Result<Vec<_>, DecodeError>>()?;
                PrefetchCall::Hint { stream, hints }
            }
            PROGRESS => PrefetchCall::Progress { stream: r.u64()?, through_seq: r.u32()? },
            END => PrefetchCall::End { stream: r.u64()? },
            _ => return Err(DecodeError::NotCanonical("unknown prefetch-v1 call")),
        };
        r.finish()?;
        Ok(call)
    }
}

/// What a `prefetch-v1` `Hint` answers: how many of its hints the drive
/// queued (the first ones; the rest did not fit the stream's bound and may
/// be sent again once the client has made progress). Other calls answer
/// nothing.
pub fn encode_hints_queued(n: u16) -> Vec<u8> {
    let mut w = Writer::default();
    w.u16(n);
    w.into_vec()
}

/// Decodes [`encode_hints_queued`]'s result.
pub fn decode_hints_queued(result: &[u8]) -> Result<u16, DecodeError> {
    let mut r = Reader::new(result);
    let n = r.u16()?;
    r.finish()?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_round_trip_and_bad_blocks_are_refused() {
        let calls = [
            PrefetchCall::Hint {
                stream: 7,
                hints: vec![ReadHint { seq: 3, region: Region { offset: 4096, length: 512 } }],
            },
            PrefetchCall::Progress { stream: 7, through_seq: 3 },
            PrefetchCall::End { stream: 7 },
        ];
        for c in calls {
            assert_eq!(PrefetchCall::decode(&c.encode()).unwrap(), c);
            let mut longer = c.encode();
            longer.push(0);
            assert!(PrefetchCall::decode(&longer).is_err(), "trailing byte");
        }
        assert!(PrefetchCall::decode(&[9]).is_err(), "unknown call");
        let mut over = vec![HINT];
        over.extend_from_slice(&[0; 8]);
        over.extend_from_slice(&(PREFETCH_HINTS_PER_CALL_MAX as u16 + 1).to_le_bytes());
        assert!(matches!(PrefetchCall::decode(&over), Err(DecodeError::OverLimit { .. })));
        assert_eq!(decode_hints_queued(&encode_hints_queued(300)).unwrap(), 300);
    }

    proptest::proptest! {
        /// Any bytes: an error or a call that re-encodes to them, never a panic
        /// (the fuzz target `extension_decode` runs the same check longer).
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            if let Ok(call) = PrefetchCall::decode(&bytes) {
                proptest::prop_assert_eq!(call.encode(), bytes);
            }
        }
    }

    /// Known-answer bytes (PROTOCOL.md, "Extensions").
    #[test]
    fn hint_bytes_are_as_documented() {
        let c =
            PrefetchCall::Hint { stream: 1, hints: vec![ReadHint { seq: 2, region: Region { offset: 3, length: 4 } }] };
        let want = ["01", "0100000000000000", "0100", "02000000", "0300000000000000", "0400000000000000"];
        assert_eq!(hex(&c.encode()), want.concat());
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
