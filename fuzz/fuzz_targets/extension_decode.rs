//! Fuzzes the decoders of drive extensions' arguments and results — the
//! `prefetch-v1` calls a drive decodes from every `EXTENSION` request that
//! names it, and the `HINT` result a client decodes. Whatever decodes must
//! re-encode to exactly the bytes it came from (PROTOCOL.md: one encoding
//! per value), stay within its limit, and no input may panic.
//!
//! Run: `cd fuzz && cargo +nightly fuzz run extension_decode -- -max_total_time=180`
#![no_main]

use libfuzzer_sys::fuzz_target;
use nasd_proto::extension::{decode_hints_queued, encode_hints_queued, PrefetchCall};
use nasd_proto::limits::PREFETCH_HINTS_PER_CALL_MAX;

fuzz_target!(|data: &[u8]| {
    if let Ok(call) = PrefetchCall::decode(data) {
        if let PrefetchCall::Hint { hints, .. } = &call {
            assert!(hints.len() <= PREFETCH_HINTS_PER_CALL_MAX, "a decoded call over its hint limit");
        }
        assert_eq!(call.encode(), data, "prefetch-v1 call re-encodes differently: {call:?}");
    }
    if let Ok(n) = decode_hints_queued(data) {
        assert_eq!(encode_hints_queued(n), data, "hints-queued result re-encodes differently");
    }
});
