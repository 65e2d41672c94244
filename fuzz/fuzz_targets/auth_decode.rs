//! Fuzzes the authentication-server protocol decoders the server, the file
//! manager and clients run on bytes from a peer: no panic, and whatever
//! decodes re-encodes to exactly the bytes it came from.
//!
//! Run: `cd fuzz && cargo +nightly fuzz run auth_decode -- -max_total_time=120`
#![no_main]

use libfuzzer_sys::fuzz_target;
use nasd_proto::auth::{AuthReply, AuthRequest};

fuzz_target!(|body: &[u8]| {
    if let Ok((id, req)) = AuthRequest::decode(body) {
        assert_eq!(req.encode(id), body, "request re-encodes differently");
    }
    if let Ok((id, reply)) = AuthReply::decode(body) {
        let again = match &reply {
            Ok(r) => r.encode(id),
            Err((status, message)) => AuthReply::encode_error(id, *status, message),
        };
        assert_eq!(again, body, "reply re-encodes differently");
    }
});
