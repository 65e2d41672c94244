//! Fuzzes every decoder a drive or client runs on bytes from a peer, and checks
//! that the encoding is canonical: whatever decodes re-encodes to exactly the
//! bytes it came from (PROTOCOL.md: "There is exactly one encoding of each
//! value"). Any panic, or any decoded value that re-encodes differently, is a
//! crash.
//!
//! Run: `cd fuzz && cargo +nightly fuzz run frame_decode -- -max_total_time=180`
#![no_main]

use libfuzzer_sys::fuzz_target;
use nasd_proto::limits::HEADER_LEN;
use nasd_proto::{
    decode_error_message, encode_error_message, DriveControl, FrameHeader, FramePrefix, PartitionControl, Reply,
    Request,
};

/// Decodes `args` as the arguments of operation `opcode` every way a peer's
/// bytes are decoded (request, successful reply, failed reply) and checks
/// each success re-encodes to `args` exactly.
fn check_args(opcode: u16, args: &[u8]) {
    if let Ok(req) = Request::decode(opcode, args) {
        assert_eq!(req.opcode(), opcode, "request decoded under another opcode: {req:?}");
        assert_eq!(req.encode_args(), args, "request re-encodes differently: {req:?}");
    }
    if let Ok(reply) = Reply::decode(opcode, args) {
        assert_eq!(reply.encode(), args, "reply re-encodes differently: {reply:?}");
    }
    if let Ok(msg) = decode_error_message(args) {
        assert_eq!(encode_error_message(&msg), args, "error message re-encodes differently: {msg:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    // A whole frame prefix, as the drive and client parse one.
    if let Ok(prefix) = FramePrefix::parse(data) {
        let again =
            FramePrefix::encode_traced(&prefix.header, prefix.trace.as_ref(), prefix.capability, prefix.args, &prefix.digest);
        assert_eq!(again, data, "frame prefix re-encodes differently: {:?}", prefix.header);
        assert_eq!(prefix.header.body_len() + HEADER_LEN, data.len());
        check_args(prefix.header.opcode, prefix.args);
    }

    // The header alone.
    if let Some(head) = data.get(..HEADER_LEN).and_then(|b| <&[u8; HEADER_LEN]>::try_from(b).ok()) {
        if let Ok(h) = FrameHeader::decode(head) {
            assert_eq!(&h.encode(), head, "header re-encodes differently: {h:?}");
            // Derived quantities must not panic or overflow for any valid header.
            let count = h.chunk_count();
            if count > 0 {
                let last = h.chunk_size(count - 1);
                assert!(last > 0 && last <= h.chunk_len);
                assert_eq!((count - 1) * h.chunk_len as u64 + last as u64, h.data_len);
            }
        }
    }

    // Argument decoders reached directly (a valid frame prefix is a narrow
    // target): the first two bytes choose the opcode, the rest are arguments.
    if let Some((op, args)) = data.split_first_chunk::<2>() {
        check_args(u16::from_le_bytes(*op), args);
    }

    // The control objects' published formats.
    if let Ok(d) = DriveControl::decode(data) {
        assert_eq!(d.encode(), data, "drive control re-encodes differently: {d:?}");
    }
    if let Ok(p) = PartitionControl::decode(data) {
        assert_eq!(p.encode(), data, "partition control re-encodes differently: {p:?}");
    }
});
