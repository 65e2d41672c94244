//! Fuzzes the decoders DSFS adds — the identity credential a drive reads
//! from every request under key type `IDENTITY`, pre-authorization lists as
//! they arrive in `SET_PAL`/`SET_SUPER_PAL` and as the drive reads them back
//! from its store, the authorization scheme byte — and the PAL match the
//! drive runs on every request by identity. Whatever decodes must re-encode
//! to exactly the bytes it came from (PROTOCOL.md: one encoding per value),
//! a decoded PAL must be within its limit and in canonical order, and no
//! input may panic.
//!
//! Run: `cd fuzz && cargo +nightly fuzz run dsfs_decode -- -max_total_time=180`
#![no_main]

use libfuzzer_sys::fuzz_target;
use nasd_proto::limits::PAL_ENTRIES_MAX;
use nasd_proto::{opcode, AuthScheme, IdentityData, ObjectPal, Pal, Reply, Request, PAL_RIGHTS};

fn check_pal(pal: &Pal, user: u32, role: u32) {
    assert!(pal.entries.len() <= PAL_ENTRIES_MAX, "a decoded PAL over its limit");
    assert!(pal.entries.windows(2).all(|w| w[0].principal < w[1].principal), "a decoded PAL out of order");
    assert!(pal.entries.iter().all(|e| e.rights != 0 && e.rights & !PAL_RIGHTS == 0));
    if let Some(rights) = pal.rights_for(user, role) {
        assert_eq!(rights & !PAL_RIGHTS, 0, "a match granting an ungrantable right");
    }
    assert_eq!(Pal::new(pal.entries.clone()), *pal, "a canonical list is its own canonical form");
}

fuzz_target!(|data: &[u8]| {
    if let Ok(id) = IdentityData::decode(data) {
        assert_eq!(&id.encode()[..], data, "identity credential re-encodes differently: {id:?}");
    }
    let (user, role) = match data.get(..8) {
        Some(b) => (u32::from_le_bytes(b[..4].try_into().unwrap()), u32::from_le_bytes(b[4..].try_into().unwrap())),
        None => (0, 0),
    };
    if let Ok(pal) = Pal::from_bytes(data) {
        assert_eq!(pal.to_bytes(), data, "PAL re-encodes differently: {pal:?}");
        check_pal(&pal, user, role);
    }
    if let Ok(p) = ObjectPal::from_bytes(data) {
        assert_eq!(p.to_bytes(), data, "object PAL re-encodes differently: {p:?}");
        check_pal(&p.pal, user, role);
    }
    if let Some(&b) = data.first() {
        if let Ok(s) = AuthScheme::from_bits(b) {
            assert_eq!(s.bits(), b);
            assert!(s.capabilities() || s.pals());
        }
    }
    for op in [opcode::SET_PAL, opcode::SET_SUPER_PAL, opcode::SET_AUTH_SCHEME, opcode::SET_IDENTITY_KEY] {
        if let Ok(req) = Request::decode(op, data) {
            assert_eq!(req.encode_args(), data, "request re-encodes differently: {req:?}");
        }
    }
    for op in [opcode::GET_PAL, opcode::GET_SUPER_PAL, opcode::GET_AUTH_SCHEME] {
        if let Ok(reply) = Reply::decode(op, data) {
            assert_eq!(reply.encode(), data, "reply re-encodes differently: {reply:?}");
        }
    }
});
