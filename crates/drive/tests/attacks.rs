//! Attacks on a drive with security enforced (docs/SECURITY.md, "Threat
//! model" and "The drive's checks").
//!
//! Each test is one family of attacks against its own drive (served on
//! 127.0.0.1:0 over a tempdir store, with a known master key, a drive key,
//! partition keys and working keys all set up with protected requests; see
//! `attacks/harness.rs`). Every named case asserts
//!
//! - the exact refusal status the check order of SECURITY.md implies (and
//!   that refusals before authentication carry no key, refusals after it are
//!   protected with the request's key),
//! - that nothing changed: the victim object's bytes and full attributes and
//!   the partition's usage, read with the drive key before and after,
//! - that an honest client (nasd-client, on another connection, with a
//!   capability minted then) still writes and reads right after,
//!
//! and at the end of each family the audit trail must hold a record of every
//! refusal and authorization the family made, with its status, key type,
//! operation and audit id. Exhaustive loops (every bit of a capability, of a
//! request) check the exact status per bit and the victim every few bits,
//! and the full state at the end of the loop.

#[path = "attacks/harness.rs"]
mod harness;

use harness::*;
use nasd_client::ClientError;
use nasd_crypto::{key_context, mint_capability, seal, seal_key, Key, MacAlgorithm};
use nasd_proto::limits::{CAPABILITY_LEN_MAX, DIGEST_LEN, HEADER_LEN, OBJECT_SIZE_MAX};
use nasd_proto::{
    opcode, rights, AttrMask, Attributes, CapabilityArgs, Region, Reply, Request, SealedCapabilityPrefix, Status,
    CAPABILITY_ARGS_LEN, SEALED_CAPABILITY_PREFIX_LEN,
};
use std::collections::BTreeMap;

const SECOND: u64 = 1_000_000_000;
const MILLISECOND: u64 = 1_000_000;

/// Request arguments of a read of the victim's first bytes.
fn read_first(d: &Drive) -> Request {
    d.read_req(0, 100)
}

fn getattr(d: &Drive) -> Request {
    Request::GetAttr { partition: P1, object: d.victim }
}

fn setattr(d: &Drive, mask: AttrMask, f: impl FnOnce(&mut Attributes)) -> Request {
    let mut attrs = Attributes::default();
    f(&mut attrs);
    Request::SetAttr { partition: P1, object: d.victim, mask, attrs: attrs.masked(mask) }
}

// ====================================================================
// 1. Forged capabilities and capabilities edited by their holder.
// ====================================================================

#[test]
fn forged_and_edited_capabilities_are_refused() {
    let d = Drive::start();
    let read = read_first(&d);
    let mut base = d.cap_args(P1, d.victim, rights::READ | rights::GETATTR);
    base.region = rg(0, 5000);
    let good = d.mint(&base, false);
    d.control("honest read with the capability (control)", &frame(&good, IA, &read));

    d.attack(
        "forged capability: random capability key",
        &frame(&good.with_key(Key::random()), IA, &read),
        Status::BadDigest,
    );
    let other = d.cap(rights::ALL, |_| {});
    d.attack(
        "forged capability: another capability's key",
        &frame(&good.with_key(other.key().unwrap().clone()), IA, &read),
        Status::BadDigest,
    );
    let (token, key) = mint_capability(&Key::random(), &base, false).unwrap();
    let outsider = Cred::Cap { token, key, alg: MacAlgorithm::Blake3, args: base.clone() };
    d.attack("forged capability: minted without the working key", &frame(&outsider, IA, &read), Status::BadDigest);
    let (token, key) = mint_capability(&Key::random(), &base, true).unwrap();
    let outsider = Cred::Cap { token, key, alg: MacAlgorithm::Blake3, args: base.clone() };
    d.attack(
        "forged sealed capability: sealed without the working key",
        &frame(&outsider, IA | PC, &read),
        Status::BadCapability,
    );

    // A hostile holder edits the public arguments and MACs its request with
    // the capability key it was given: the drive derives another key.
    let data = pattern(11, 100);
    let write = d.write_req(0, 100);
    let (victim, scratch) = (d.victim, d.scratch);
    type Edit = Box<dyn Fn(&mut CapabilityArgs)>;
    let edits: Vec<(&str, Edit, Request, Status)> = vec![
        (
            "edited: rights raised to ALL, then write",
            Box::new(|a| a.rights = rights::ALL),
            write.clone(),
            Status::BadDigest,
        ),
        (
            "edited: region widened to the whole object",
            Box::new(|a| a.region = CapabilityArgs::WHOLE_OBJECT),
            d.read_req(6000, 100),
            Status::BadDigest,
        ),
        (
            "edited: expiry pushed a year ahead",
            Box::new(|a| a.expiration_ns += 365 * 86_400 * SECOND),
            read.clone(),
            Status::BadDigest,
        ),
        (
            "edited: object changed to another object",
            Box::new(move |a| a.object = scratch),
            Request::Read { partition: P1, object: scratch, regions: vec![rg(0, 10)] },
            Status::BadDigest,
        ),
        (
            "edited: partition changed to partition 2",
            Box::new(|a| a.partition = P2),
            Request::Read { partition: P2, object: victim, regions: vec![rg(0, 10)] },
            Status::BadDigest,
        ),
        (
            "edited: access control version changed",
            Box::new(|a| a.access_control_version = 7),
            read.clone(),
            Status::BadDigest,
        ),
        ("edited: audit id changed", Box::new(|a| a.audit_id = 1), read.clone(), Status::BadDigest),
        (
            "edited: minimum protection lowered to NONE",
            Box::new(|a| a.min_protection = prot(NONE)),
            read.clone(),
            Status::BadDigest,
        ),
        ("edited: drive id changed", Box::new(|a| a.drive_id[0] ^= 0x80), read.clone(), Status::BadDigest),
        (
            "edited: MAC algorithm switched to HMAC-SHA-256",
            Box::new(|a| a.algorithm = MacAlgorithm::HmacSha256 as u8),
            read.clone(),
            Status::BadDigest,
        ),
        (
            "edited: map epoch raised past the partition's minimum",
            Box::new(|a| a.map_epoch += 1),
            read.clone(),
            Status::BadDigest,
        ),
        (
            "edited: key version changed to one never set",
            Box::new(|a| a.key_version = 2),
            read.clone(),
            Status::KeyVersionRetired,
        ),
        (
            "edited: partition changed to one without keys",
            Box::new(|a| a.partition = P_NO_KEYS),
            read.clone(),
            Status::KeyVersionRetired,
        ),
    ];
    for (name, edit, req, want) in edits {
        let mut a = base.clone();
        edit(&mut a);
        let alg = MacAlgorithm::from_id(a.algorithm).unwrap();
        let forged = Cred::Cap { token: a.encode().to_vec(), key: good.key().unwrap().clone(), alg, args: a };
        let f = if matches!(req, Request::Write { .. }) {
            frame_data(&forged, IA, &req, &data)
        } else {
            frame(&forged, IA, &req)
        };
        d.attack(name, &f, want);
    }
    d.finish("forged and edited capabilities");
}

// ====================================================================
// 2. Every single-bit flip of a capability token.
// ====================================================================

fn cap_field(byte: usize) -> &'static str {
    match byte {
        0 => "format",
        1 => "algorithm",
        2 => "min_protection",
        3 => "reserved",
        4..=7 => "key_version",
        8..=23 => "drive_id",
        24..=31 => "partition",
        32..=39 => "object",
        40..=47 => "region.offset",
        48..=55 => "region.length",
        56..=63 => "access_control_version",
        64..=67 => "rights",
        68..=71 => "map_epoch",
        72..=79 => "expiration",
        _ => "audit_id",
    }
}

/// The status the check order implies for a clear capability token with bit
/// `bit` of byte `byte` flipped (an independent model of the 88-byte format):
/// a token that is not well formed is BAD_CAPABILITY (check 2); one naming a
/// working key the drive does not hold is KEY_VERSION_RETIRED (check 3);
/// anything else derives another capability key: BAD_DIGEST (check 4).
fn expect_clear_flip(d: &Drive, a: &CapabilityArgs, byte: usize, bit: usize) -> Status {
    let within = |start: usize| (byte - start) * 8 + bit;
    let key = |p: u64, v: u32| if d.live(p, v) { Status::BadDigest } else { Status::KeyVersionRetired };
    let region = |offset: u64, length: u64| {
        if offset > OBJECT_SIZE_MAX || length > OBJECT_SIZE_MAX - offset {
            Status::BadCapability
        } else {
            Status::BadDigest
        }
    };
    match byte {
        0 | 3 => Status::BadCapability,
        1 => {
            if matches!(a.algorithm ^ (1 << bit), 1 | 2) {
                Status::BadDigest
            } else {
                Status::BadCapability
            }
        }
        2 => {
            if (a.min_protection.bits() ^ (1 << bit)) & !DEFINED != 0 {
                Status::BadCapability
            } else {
                Status::BadDigest
            }
        }
        4..=7 => key(a.partition, a.key_version ^ (1 << within(4))),
        24..=31 => key(a.partition ^ (1 << within(24)), a.key_version),
        40..=47 => region(a.region.offset ^ (1 << within(40)), a.region.length),
        48..=55 => region(a.region.offset, a.region.length ^ (1 << within(48))),
        64..=67 => {
            if (a.rights ^ (1 << within(64))) & !rights::ALL != 0 {
                Status::BadCapability
            } else {
                Status::BadDigest
            }
        }
        _ => Status::BadDigest,
    }
}

/// The same for a sealed token: the clear prefix names the working key
/// (KEY_VERSION_RETIRED if the drive has none of that version and
/// partition); any other change makes the seal fail to open (BAD_CAPABILITY).
fn expect_sealed_flip(d: &Drive, a: &CapabilityArgs, byte: usize, bit: usize) -> Status {
    let within = |start: usize| (byte - start) * 8 + bit;
    let opens_or_retired =
        |p: u64, v: u32| if d.live(p, v) { Status::BadCapability } else { Status::KeyVersionRetired };
    match byte {
        4..=7 => opens_or_retired(a.partition, a.key_version ^ (1 << within(4))),
        8..=15 => opens_or_retired(a.partition ^ (1 << within(8)), a.key_version),
        _ => Status::BadCapability,
    }
}

#[test]
fn every_capability_bit_flip_is_refused() {
    let d = Drive::start();
    // P1 holds working keys 1 (previous) and 3 (current): a one-bit flip of
    // version 1 names a key the drive holds. P2 (= 1 ^ 2) holds version 1: a
    // one-bit flip of the partition names a partition with that key.
    d.rotate(P1, 3);
    let mut args = d.cap_args(P1, d.victim, rights::READ | rights::WRITE | rights::GETATTR);
    args.key_version = 1;
    args.region = rg(0, 1 << 20);
    let clear = d.mint(&args, false);
    let sealed = d.mint(&args, true);
    let req = d.write_req(0, 64);
    let data = vec![0xEE; 64];
    // Controls: both tokens work (they rewrite the victim's own bytes).
    let same = d.victim_content()[..64].to_vec();
    d.expect_ok("clear capability control", &frame_data(&clear, IA | ID, &req, &same));
    d.expect_ok("sealed capability control", &frame_data(&sealed, IA | ID | PC, &req, &same));
    d.snapshot();

    let mut conn = Conn::open(d.addr());
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for (label, cred, protection) in [("clear", &clear, IA | ID), ("sealed", &sealed, IA | ID | PC)] {
        let token = cred.token().to_vec();
        for bit in 0..token.len() * 8 {
            let (byte, b) = (bit / 8, bit % 8);
            let (want, field) = if label == "clear" {
                (expect_clear_flip(&d, &args, byte, b), cap_field(byte))
            } else {
                (
                    expect_sealed_flip(&d, &args, byte, b),
                    if byte < SEALED_CAPABILITY_PREFIX_LEN { "prefix" } else { "sealed body" },
                )
            };
            // A man in the middle flips the bit in a signed request.
            let mut f = frame_data(cred, protection, &req, &data);
            f.bytes[f.cap_at + byte] ^= 1 << b;
            let rep = conn.send(&f);
            assert_eq!(
                rep.status(),
                want,
                "{label} token, man in the middle, byte {byte} ({field}) bit {b}: {}",
                rep.message()
            );
            assert!(!rep.authenticated, "{label} byte {byte} bit {b}: refusal claims a key");
            d.record(&f, want);
            *tally.entry(format!("{label}: {}", want.name())).or_default() += 1;
            // The holder flips the bit and MACs the request with its own key.
            if label == "clear" {
                let mut t = token.clone();
                t[byte] ^= 1 << b;
                let f = build(cred, protection, &t, req.opcode(), &req.encode_args(), &data, fresh_nonce());
                let rep = conn.send(&f);
                assert_eq!(
                    rep.status(),
                    want,
                    "clear token, re-signed by the holder, byte {byte} ({field}) bit {b}: {}",
                    rep.message()
                );
                d.record(&f, want);
            }
            if bit % 128 == 127 {
                d.quick_check(&format!("{label} capability bit {bit}"));
            }
        }
        d.verify(&format!("every bit flip of a {label} capability"));
    }
    eprintln!("capability bit flips: {tally:?}");
    for name in [
        "clear capability: each of its 704 bits flipped by a man in the middle (exact status per bit)",
        "clear capability: each of its 704 bits flipped and re-signed by its holder (exact status per bit)",
        "sealed capability: each of its 1152 bits flipped (exact status per bit)",
    ] {
        d.cases.borrow_mut().push(name.into());
    }
    // Each kind of outcome happened.
    for k in [
        "clear: BAD_CAPABILITY",
        "clear: BAD_DIGEST",
        "clear: KEY_VERSION_RETIRED",
        "sealed: BAD_CAPABILITY",
        "sealed: KEY_VERSION_RETIRED",
    ] {
        assert!(tally.contains_key(k), "no flip gave {k}: {tally:?}");
    }
    d.finish("capability bit flips");
}

// ====================================================================
// 3. Every single-bit flip of a protected request.
// ====================================================================

#[test]
fn every_request_bit_flip_is_refused() {
    let d = Drive::start();
    let cap = d.cap(rights::READ | rights::WRITE | rights::GETATTR, |_| {});
    let req = d.write_req(0, 64);
    let data = pattern(3, 64);
    let template = frame_data(&cap, IA | ID, &req, &data);
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();

    // Header bits: a flipped length can break framing, so each flip goes on
    // its own connection, whose write half is closed after the frame; the
    // drive must answer with a refusal or close without executing anything.
    for bit in 0..HEADER_LEN * 8 {
        let (byte, b) = (bit / 8, bit % 8);
        let mut f = frame_data(&cap, IA | ID, &req, &data);
        f.bytes[byte] ^= 1 << b;
        let outcome = Conn::open(d.addr()).send_and_close(&f.bytes);
        assert_ne!(outcome, Some(Status::Ok), "header byte {byte} bit {b}: a flipped request was accepted");
        // Opcode, request id and nonce leave the framing intact: the digest refuses.
        if (6..16).contains(&byte) || (40..56).contains(&byte) {
            assert_eq!(outcome, Some(Status::BadDigest), "header byte {byte} bit {b}");
        }
        *tally.entry(outcome.map_or("closed without reply".into(), |s| s.name().to_string())).or_default() += 1;
        if bit % 16 == 15 {
            d.quick_check(&format!("header bit {bit}"));
        }
    }
    d.verify("every header bit flip");

    // Capability, argument and digest bits (framing intact): exact statuses.
    let mut conn = Conn::open(d.addr());
    for at in template.cap_at..template.data_at {
        for b in 0..8 {
            let mut f = frame_data(&cap, IA | ID, &req, &data);
            f.bytes[at] ^= 1 << b;
            let want =
                if at < f.args_at { expect_clear_flip(&d, cap.args(), at - f.cap_at, b) } else { Status::BadDigest };
            let rep = conn.send(&f);
            let section = if at < f.args_at {
                "capability"
            } else if at < f.digest_at {
                "arguments"
            } else {
                "digest"
            };
            assert_eq!(rep.status(), want, "{section} byte {at} bit {b}: {}", rep.message());
            d.record(&f, want);
            *tally.entry(format!("{section}: {}", want.name())).or_default() += 1;
        }
        if at % 16 == 15 {
            d.quick_check(&format!("request byte {at}"));
        }
    }
    d.verify("every capability, argument and digest bit flip");

    // Data and tag bits: the data tag refuses, and nothing is written.
    for at in template.data_at..template.bytes.len() {
        for b in 0..8 {
            let mut f = frame_data(&cap, IA | ID, &req, &data);
            f.bytes[at] ^= 1 << b;
            let rep = conn.send(&f);
            assert_eq!(rep.status(), Status::BadDataTag, "data byte {} bit {b}: {}", at - f.data_at, rep.message());
            assert!(rep.authenticated, "a data tag refusal comes after authentication: protected");
            d.record(&f, Status::BadDataTag);
        }
        if at % 16 == 15 {
            d.quick_check(&format!("data byte {at}"));
        }
    }
    d.verify("every data and tag bit flip");

    // Under PRIVACY_ARGS and PRIVACY_DATA: the ciphertext is MACed.
    let private = d.cap(rights::READ | rights::WRITE | rights::GETATTR, |a| a.min_protection = prot(IA | ID | PA | PD));
    let t = frame_data(&private, IA | ID | PA | PD, &req, &data);
    for at in (t.args_at..t.digest_at).chain(t.data_at..t.bytes.len()) {
        let mut f = frame_data(&private, IA | ID | PA | PD, &req, &data);
        f.bytes[at] ^= 0x10;
        let want = if at < f.digest_at { Status::BadDigest } else { Status::BadDataTag };
        let rep = conn.send(&f);
        assert_eq!(rep.status(), want, "private frame byte {at}: {}", rep.message());
        d.record(&f, want);
    }
    d.verify("every encrypted argument and data byte flipped");
    eprintln!("request bit flips: {tally:?}");
    for name in [
        "request header: each of its 448 bits flipped (refused or closed; BAD_DIGEST for opcode, id, nonce)",
        "request capability: each bit flipped in a signed frame (exact status per bit)",
        "request arguments and digest: each bit flipped (BAD_DIGEST)",
        "request data and tags: each bit flipped (BAD_DATA_TAG, nothing written)",
        "encrypted arguments and data: each byte flipped (BAD_DIGEST / BAD_DATA_TAG)",
    ] {
        d.cases.borrow_mut().push(name.into());
    }
    d.finish("request bit flips");
}

// ====================================================================
// 4. Modified arguments and data in flight.
// ====================================================================

#[test]
fn modified_arguments_and_data_are_refused() {
    let d = Drive::start();
    let cap = d.cap(rights::READ | rights::WRITE | rights::GETATTR, |a| a.min_protection = prot(IA | ID));
    let len = 3 * CHUNK as usize + 164; // four chunks, the last short
    let data = pattern(4, len);
    let req = d.write_req(0, len as u64);
    let signed = || frame_data(&cap, IA | ID, &req, &data);

    let mut f = signed();
    f.bytes[f.args_at + 8..f.args_at + 16].copy_from_slice(&d.scratch.to_le_bytes());
    d.attack("man in the middle: object changed in the arguments", &f, Status::BadDigest);
    let mut f = signed();
    f.bytes[f.args_at..f.args_at + 8].copy_from_slice(&P2.to_le_bytes());
    d.attack("man in the middle: partition changed in the arguments", &f, Status::BadDigest);
    let mut f = signed();
    f.bytes[f.args_at + 18..f.args_at + 26].copy_from_slice(&4096u64.to_le_bytes());
    d.attack("man in the middle: region offset changed", &f, Status::BadDigest);
    let mut f = signed();
    f.bytes[f.args_at + 26] ^= 0x01;
    d.attack("man in the middle: region length changed", &f, Status::BadDigest);
    let mut f = frame_data(&cap, IA | ID | PA, &req, &data);
    f.bytes[f.args_at + 9] ^= 0x01;
    d.attack("man in the middle: encrypted arguments changed", &f, Status::BadDigest);
    let (a, b) = (frame_data(&cap, IA | ID | PA, &req, &data), frame_data(&cap, IA | ID | PA, &req, &data));
    let mut f = a.clone();
    f.bytes[f.args_at..f.digest_at].copy_from_slice(&b.bytes[b.args_at..b.digest_at]);
    d.attack("man in the middle: encrypted arguments from another request", &f, Status::BadDigest);

    let tag = 32;
    let chunk = CHUNK as usize;
    let mut f = signed();
    f.bytes[f.data_at + 17] ^= 0x40;
    d.attack("data byte changed in the first chunk", &f, Status::BadDataTag);
    let mut f = signed();
    let last = f.bytes.len() - tag - 1;
    f.bytes[last] ^= 0x01;
    d.attack("data byte changed in the last chunk, after three good chunks", &f, Status::BadDataTag);
    let mut f = signed();
    f.bytes[f.data_at + chunk + 3] ^= 0x01;
    d.attack("data tag changed", &f, Status::BadDataTag);
    let mut f = signed();
    let (c0, c1) = (f.data_at, f.data_at + chunk + tag);
    let first: Vec<u8> = f.bytes[c0..c1].to_vec();
    let second: Vec<u8> = f.bytes[c1..c1 + chunk + tag].to_vec();
    f.bytes[c0..c0 + chunk + tag].copy_from_slice(&second);
    f.bytes[c1..c1 + chunk + tag].copy_from_slice(&first);
    d.attack("two data chunks swapped with their tags", &f, Status::BadDataTag);
    let (a, b) = (signed(), signed());
    let mut f = a.clone();
    f.bytes[f.data_at..].copy_from_slice(&b.bytes[b.data_at..]);
    d.attack("data and tags spliced from another request", &f, Status::BadDataTag);
    let mut f = frame_data(&cap, IA | ID | PD, &req, &data);
    f.bytes[f.data_at + 100] ^= 0x01;
    d.attack("encrypted data byte changed (PRIVACY_DATA)", &f, Status::BadDataTag);
    let mut f = frame_data(&cap, IA | ID | PD, &req, &data);
    let end = f.bytes.len();
    f.bytes[end - tag..].fill(0);
    d.attack("last tag zeroed (PRIVACY_DATA)", &f, Status::BadDataTag);

    // The unmodified request is accepted (and writes).
    d.expect_ok("unmodified request (control)", &signed());
    d.snapshot();
    assert!(d.victim_content()[..len] == data[..], "the control write landed");
    d.verify("unmodified request");
    d.finish("modified arguments and data");
}

// ====================================================================
// 5. Replays.
// ====================================================================

#[test]
fn replays_are_refused() {
    let d = Drive::start();
    let cap = d.cap(rights::READ | rights::WRITE | rights::GETATTR, |_| {});
    let (a, b) = (pattern(51, 256), pattern(52, 256));
    let write = d.write_req(0, 256);

    let w = frame_data(&cap, IA | ID, &write, &a);
    let mut conn = Conn::open(d.addr());
    let rep = conn.send(&w);
    d.judge("original write", &w, &rep, Status::Ok);
    d.snapshot();
    let rep = conn.send(&w);
    d.judge("replay on the same connection", &w, &rep, Status::NonceReplayed);
    d.cases.borrow_mut().push("replay on the same connection".into());
    d.verify("replay on the same connection");
    d.attack("replay on another connection", &w, Status::NonceReplayed);
    d.ok_data(&d.dk(), IA | ID, &write, &b);
    d.snapshot();
    d.attack("replay of a write to undo a later write", &w, Status::NonceReplayed);
    assert!(d.victim_content()[..256] == b[..]);

    let ro = d.cap(rights::READ, |_| {});
    let r = frame_data(&ro, IA | ID, &write, &a);
    d.attack("write with a read capability", &r, Status::RightsInsufficient);
    d.attack("replay of a request refused after authentication", &r, Status::NonceReplayed);
    let m = frame(&d.pk(P1), IA, &Request::SetMinProtection { partition: P1, protection: prot(IA) });
    d.expect_ok("setminprotection by the manager", &m);
    d.attack("replay of a key-management request", &m, Status::NonceReplayed);

    let read = read_first(&d);
    let now = now_ns();
    d.attack(
        "nonce older than the skew",
        &frame_at(&cap, IA, &read, nonce_at(now - SKEW_NS - SECOND)),
        Status::NonceOutsideWindow,
    );
    d.attack(
        "nonce further ahead than the skew",
        &frame_at(&cap, IA, &read, nonce_at(now + SKEW_NS + SECOND)),
        Status::NonceOutsideWindow,
    );
    d.attack("nonce time zero", &frame_at(&cap, IA, &read, nonce_at(0)), Status::NonceOutsideWindow);
    d.attack("nonce time u64::MAX", &frame_at(&cap, IA, &read, nonce_at(u64::MAX)), Status::NonceOutsideWindow);
    let started = d.started_before();
    if now_ns() - started < SKEW_NS - SECOND {
        d.attack(
            "nonce from before the drive started (inside the skew)",
            &frame_at(&cap, IA, &read, nonce_at(started)),
            Status::NonceOutsideWindow,
        );
    }

    // A request stamped ahead of the drive clock, even inside the skew, is
    // refused and remembered, never executed: so nothing executed before a
    // restart can carry a time after it.
    let ahead_ns = now_ns() + 300 * MILLISECOND;
    let ahead = build(&cap, IA | ID, &cap.field(), write.opcode(), &write.encode_args(), &a, nonce_at(ahead_ns));
    d.attack("write stamped ahead of the drive clock (inside the skew)", &ahead, Status::NonceOutsideWindow);
    while now_ns() <= ahead_ns + 10 * MILLISECOND {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    d.attack("the same write once the drive clock has passed its time", &ahead, Status::NonceReplayed);

    // Replays across a restart: the nonce cache is gone, the drive's start
    // time is the defence.
    let captured = frame_data(&cap, IA | ID, &write, &a);
    let rep = d.send(&captured);
    d.judge("write captured before the restart", &captured, &rep, Status::Ok);
    d.ok_data(&d.dk(), IA | ID, &write, &b);
    d.snapshot();
    let unsent = frame_data(&cap, IA | ID, &write, &a);
    let future =
        build(&cap, IA | ID, &cap.field(), write.opcode(), &write.encode_args(), &a, nonce_at(now_ns() + 3 * SECOND));
    d.attack("write stamped 3 s ahead, just before the restart", &future, Status::NonceOutsideWindow);
    let stop_time = now_ns();
    d.restart();
    d.verify("restart");
    d.attack("replay of a captured write after the drive restarted", &captured, Status::NonceOutsideWindow);
    d.attack("request signed before the restart, first sent after it", &unsent, Status::NonceOutsideWindow);
    d.attack("write stamped 3 s ahead, replayed right after the restart", &future, Status::NonceOutsideWindow);
    if now_ns() - stop_time < SKEW_NS - SECOND {
        d.attack(
            "nonce from between the stop and the restart",
            &frame_at(&cap, IA, &read, nonce_at(stop_time)),
            Status::NonceOutsideWindow,
        );
    }
    d.control("the capability still works after the restart (keys persisted)", &frame(&cap, IA, &read));
    d.finish("replays");
}

// ====================================================================
// 6. Capability scope: expiry, drive, partition, object, region, rights.
// ====================================================================

#[test]
fn capability_scope_and_rights_are_enforced() {
    let d = Drive::start();
    let read = read_first(&d);
    let now = now_ns();
    d.attack(
        "expired capability",
        &frame(&d.cap(rights::READ, |a| a.expiration_ns = now - SECOND), IA, &read),
        Status::CapabilityExpired,
    );
    d.attack(
        "capability that expired at time 0",
        &frame(&d.cap(rights::READ, |a| a.expiration_ns = 0), IA, &read),
        Status::CapabilityExpired,
    );
    d.attack(
        "capability for another drive",
        &frame(&d.cap(rights::READ, |a| a.drive_id = [0x42; 16]), IA, &read),
        Status::WrongDrive,
    );
    d.attack(
        "capability for a drive whose id differs in one bit",
        &frame(&d.cap(rights::READ, |a| a.drive_id[15] ^= 1), IA, &read),
        Status::WrongDrive,
    );

    let p2_object = d.create_object(P2, b"partition two");
    let p2_cap = d.mint(&d.cap_args(P2, d.victim, rights::READ | rights::WRITE), false);
    d.attack("capability for partition 2 used on partition 1", &frame(&p2_cap, IA, &read), Status::WrongObject);
    let p1_cap = d.cap(rights::READ, |a| a.object = p2_object);
    let p2_read = Request::Read { partition: P2, object: p2_object, regions: vec![rg(0, 5)] };
    d.attack("partition 1 capability used on a partition 2 object", &frame(&p1_cap, IA, &p2_read), Status::WrongObject);
    let scratch = d.scratch;
    d.attack(
        "capability for another object",
        &frame(&d.cap(rights::READ, |a| a.object = scratch), IA, &read),
        Status::WrongObject,
    );
    let create = Request::Create { partition: P1, mask: AttrMask::default(), attrs: Attributes::default() };
    d.attack(
        "create with a one-object capability",
        &frame(&d.cap(rights::ALL, |_| {}), IA, &create),
        Status::WrongObject,
    );
    let flush = Request::Flush { partition: P1, objects: vec![d.victim, d.scratch] };
    d.attack(
        "flush of two objects with a one-object capability",
        &frame(&d.cap(rights::FLUSH, |_| {}), IA, &flush),
        Status::WrongObject,
    );
    let fastcopy = Request::FastCopy { partition: P1, source: d.scratch };
    d.attack(
        "fastcopy of another object",
        &frame(&d.cap(rights::FASTCOPY, |_| {}), IA, &fastcopy),
        Status::WrongObject,
    );

    // Regions: the capability covers [1000, 2000).
    let rights_rw = rights::READ | rights::WRITE | rights::GETATTR;
    let rcap = d.cap(rights_rw, |a| a.region = rg(1000, 1000));
    let rep = d.control("read exactly the capability's region (control)", &frame(&rcap, IA, &d.read_req(1000, 1000)));
    assert!(rep.data == d.victim_content()[1000..2000]);
    // Extents under a whole-object READ capability: the victim is stored whole.
    let whole = d.cap(rights::READ, |_| {});
    let req = Request::Extents { partition: P1, object: d.victim, offset: 0, max: 8 };
    let rep = d.control("extents under a READ capability (control)", &frame(&whole, IA, &req));
    let want = Reply::Extents { covered_end: VICTIM_LEN as u64, extents: vec![rg(0, VICTIM_LEN as u64)] };
    assert_eq!(Reply::decode(nasd_proto::opcode::EXTENTS, &rep.args), Ok(want));
    // Stored digests under a whole-object READ capability: those of the
    // victim's blocks, the last padded with zeros, with no data sent.
    let bs = BLOCK as u64;
    let all_blocks = rg(0, (VICTIM_LEN as u64).div_ceil(bs) * bs);
    let req = Request::Digests { partition: P1, object: d.victim, region: all_blocks };
    let rep = d.control("digests under a READ capability (control)", &frame(&whole, IA, &req));
    let mut padded = d.victim_content();
    padded.resize(all_blocks.length as usize, 0);
    let digests = padded.chunks(BLOCK as usize).map(nasd_crypto::block_digest).collect();
    let want = Reply::Digests { logical_size: VICTIM_LEN as u64, digests };
    assert_eq!(Reply::decode(nasd_proto::opcode::DIGESTS, &rep.args), Ok(want));
    assert!(rep.data.is_empty(), "DIGESTS sends no data");
    let multi = |regions: Vec<nasd_proto::Region>| Request::Read { partition: P1, object: d.victim, regions };
    let region_cases: Vec<(&str, Request, usize)> = vec![
        ("read starting one byte before the region", d.read_req(999, 1001), 0),
        ("read ending one byte past the region", d.read_req(1000, 1001), 0),
        ("read of the byte just before the region", d.read_req(999, 1), 0),
        ("read of the byte just past the region", d.read_req(2000, 1), 0),
        ("write starting one byte before the region", d.write_req(999, 2), 2),
        ("write ending one byte past the region", d.write_req(1999, 2), 2),
        ("write of the whole region plus one byte", d.write_req(1000, 1001), 1001),
        ("second region of a read escapes by one byte", multi(vec![rg(1000, 10), rg(1990, 11)]), 0),
        ("read region whose end overflows u64", d.read_req(u64::MAX - 5, 10), 0),
        (
            "blocksrequired past the region",
            Request::BlocksRequired { partition: P1, object: d.victim, regions: vec![rg(1500, 501)] },
            0,
        ),
        (
            "extents from inside the region (they describe every byte after it)",
            Request::Extents { partition: P1, object: d.victim, offset: 1000, max: 8 },
            0,
        ),
        (
            "digests of the block holding the region (its digest covers bytes outside it)",
            Request::Digests { partition: P1, object: d.victim, region: rg(0, BLOCK as u64) },
            0,
        ),
    ];
    for (name, req, n) in region_cases {
        let f = if n > 0 { frame_data(&rcap, IA, &req, &pattern(6, n)) } else { frame(&rcap, IA, &req) };
        d.attack(name, &f, Status::RegionNotInCapability);
    }
    let any = d.cap(rights_rw, |a| {
        a.object = nasd_proto::ANY_OBJECT;
        a.region = rg(0, 100)
    });
    d.attack(
        "partition-wide capability: region still enforced",
        &frame(&any, IA, &d.read_req(50, 51)),
        Status::RegionNotInCapability,
    );

    // Rights.
    let data = pattern(7, 100);
    let acv = |mask: AttrMask| {
        setattr(&d, mask, |a| {
            a.access_control_version = 99;
            a.fs_specific = [9; 256];
        })
    };
    let fs = setattr(&d, AttrMask::FS_SPECIFIC, |a| a.fs_specific = [9; 256]);
    let (victim, len) = (d.victim, VICTIM_LEN as u64);
    let rights_cases: Vec<(&str, u32, Request, usize)> = vec![
        ("write with a read capability", rights::READ | rights::GETATTR, d.write_req(0, 100), 100),
        (
            "remove with a read capability",
            rights::READ | rights::GETATTR,
            Request::Remove { partition: P1, object: victim },
            0,
        ),
        ("setattr with a read capability", rights::READ | rights::GETATTR, fs.clone(), 0),
        (
            "setattr of the ACV with SETATTR but not SET_ACV",
            rights::SETATTR | rights::READ,
            acv(AttrMask::ACCESS_CONTROL_VERSION),
            0,
        ),
        (
            "setattr of the ACV and fs_specific without SET_ACV",
            rights::SETATTR,
            acv(AttrMask::ACCESS_CONTROL_VERSION.union(AttrMask::FS_SPECIFIC)),
            0,
        ),
        (
            "setattr of the ACV with every right but SET_ACV",
            rights::ALL & !rights::SET_ACV,
            acv(AttrMask::ACCESS_CONTROL_VERSION),
            0,
        ),
        ("getattr with only READ", rights::READ, getattr(&d), 0),
        ("read with only WRITE", rights::WRITE, read_first(&d), 0),
        (
            "fastcopy without FASTCOPY",
            rights::READ | rights::GETATTR,
            Request::FastCopy { partition: P1, source: victim },
            0,
        ),
        ("flush without FLUSH", rights::READ, Request::Flush { partition: P1, objects: vec![victim] }, 0),
        (
            "blocksrequired without GETATTR",
            rights::READ | rights::WRITE,
            Request::BlocksRequired { partition: P1, object: victim, regions: vec![rg(0, 10)] },
            0,
        ),
        (
            "extents without READ (they tell which blocks are zeros)",
            rights::ALL & !rights::READ,
            Request::Extents { partition: P1, object: victim, offset: 0, max: 8 },
            0,
        ),
        (
            "digests without READ (a block's digest confirms a guess of its bytes)",
            rights::ALL & !rights::READ,
            Request::Digests { partition: P1, object: victim, region: rg(0, BLOCK as u64) },
            0,
        ),
        ("append-only capability overwriting existing bytes", rights::APPEND, d.write_req(0, 100), 100),
        ("append-only capability writing across the end", rights::APPEND, d.write_req(len - 1, 2), 2),
        (
            "remove with every right but REMOVE",
            rights::ALL & !rights::REMOVE,
            Request::Remove { partition: P1, object: victim },
            0,
        ),
        (
            "write with every right but WRITE and APPEND",
            rights::ALL & !(rights::WRITE | rights::APPEND),
            d.write_req(0, 100),
            100,
        ),
    ];
    for (name, r, req, n) in rights_cases {
        let cap = d.cap(r, |_| {});
        let f = if n > 0 { frame_data(&cap, IA, &req, &data[..n]) } else { frame(&cap, IA, &req) };
        d.attack(name, &f, Status::RightsInsufficient);
    }
    let no_create = d.cap(rights::ALL & !rights::CREATE, |a| a.object = nasd_proto::ANY_OBJECT);
    d.attack(
        "create with a partition-wide capability without CREATE",
        &frame(&no_create, IA, &create),
        Status::RightsInsufficient,
    );

    // Controls: append at the end of another object; create with CREATE.
    let tail = d.create_object(P1, &pattern(8, 100));
    let mut app = d.cap_args(P1, tail, rights::APPEND);
    app.min_protection = prot(IA);
    let app = d.mint(&app, false);
    let append = Request::Write { partition: P1, object: tail, regions: vec![rg(100, 50)] };
    d.snapshot(); // the new object uses P1's quota
    d.expect_ok(
        "append-only capability appending at the end (control)",
        &frame_data(&app, IA, &append, &pattern(9, 50)),
    );
    let creator = d.cap(rights::CREATE, |a| a.object = nasd_proto::ANY_OBJECT);
    d.expect_ok("create with a partition-wide CREATE capability (control)", &frame(&creator, IA, &create));
    d.snapshot();
    d.verify("append and create controls");
    d.finish("capability scope and rights");
}

// ====================================================================
// 7. Protection downgrades, minimums, NO_PROTECTION bearers.
// ====================================================================

#[test]
fn protection_downgrades_are_refused() {
    let d = Drive::start();
    let read = read_first(&d);
    let min = |partition: u64, bits: u8| Request::SetMinProtection { partition, protection: prot(bits) };
    let strong = d.cap(rights::READ | rights::GETATTR, |a| a.min_protection = prot(IA | ID));
    d.control("capability minimum IA|ID, request IA|ID (control)", &frame(&strong, IA | ID, &read));
    d.attack("capability minimum IA|ID, request IA", &frame(&strong, IA, &read), Status::ProtectionTooWeak);
    let private = d.cap(rights::READ, |a| a.min_protection = prot(IA | PA));
    d.attack("capability minimum IA|PA, request IA|ID", &frame(&private, IA | ID, &read), Status::ProtectionTooWeak);
    let hidden = d.cap(rights::READ, |a| a.min_protection = prot(IA | PC));
    d.attack("capability minimum IA|PC, request IA", &frame(&hidden, IA, &read), Status::ProtectionTooWeak);
    d.attack("clear capability sent under PRIVACY_CAPABILITY", &frame(&hidden, IA | PC, &read), Status::BadCapability);
    let mut f = frame(&strong, IA | ID, &read);
    f.bytes[17] = IA;
    d.attack("man in the middle strips INTEGRITY_DATA from the header", &f, Status::BadDigest);
    let plain = d.cap(rights::READ | rights::GETATTR, |_| {});
    let mut f = frame(&plain, IA, &read);
    f.bytes[17] = NONE;
    d.attack("man in the middle strips all protection (the digest is not the key)", &f, Status::BadDigest);

    let weak = d.cap(rights::READ, |a| a.min_protection = prot(NONE));
    d.attack(
        "capability minimum NONE under the default drive minimum",
        &frame(&weak, IA, &read),
        Status::CapabilityBelowMinimum,
    );

    // The drive minimum raised to IA|ID kills IA capabilities.
    d.control("IA capability before the drive minimum is raised (control)", &frame(&plain, IA | ID, &read));
    d.expect_ok("drive minimum raised to IA|ID", &frame(&d.dk(), IA, &min(0, IA | ID)));
    d.attack(
        "IA capability after the drive minimum is raised",
        &frame(&plain, IA | ID, &read),
        Status::CapabilityBelowMinimum,
    );
    d.attack("drive key request below the drive minimum", &frame(&d.dk(), IA, &getattr(&d)), Status::ProtectionTooWeak);
    d.control("IA|ID capability meets the raised drive minimum (control)", &frame(&strong, IA | ID, &read));
    d.expect_ok("drive minimum back to IA", &frame(&d.dk(), IA | ID, &min(0, IA)));

    // The manager raises its partition's minimum.
    d.expect_ok("partition minimum raised to IA|PA by the manager", &frame(&d.pk(P1), IA, &min(P1, IA | PA)));
    d.attack(
        "IA capability after the partition minimum is raised",
        &frame(&plain, IA | PA, &read),
        Status::CapabilityBelowMinimum,
    );
    let working = Cred::Working(P1, 1, d.working_key(P1, 1).unwrap());
    d.attack(
        "working-key request below the partition minimum",
        &frame(&working, IA, &getattr(&d)),
        Status::ProtectionTooWeak,
    );
    d.attack(
        "partition-key request below the partition minimum",
        &frame(&d.pk(P1), IA, &getattr(&d)),
        Status::ProtectionTooWeak,
    );
    d.control("IA|PA capability meets the partition minimum (control)", &frame(&private, IA | PA, &read));
    let p2_object = d.create_object(P2, b"p2");
    let p2_cap = d.mint(&d.cap_args(P2, p2_object, rights::READ), false);
    let p2_read = Request::Read { partition: P2, object: p2_object, regions: vec![rg(0, 2)] };
    d.control("partition 2 IA capability unaffected (control)", &frame(&p2_cap, IA, &p2_read));
    d.expect_ok("partition minimum back to NONE", &frame(&d.pk(P1), IA | PA, &min(P1, NONE)));

    // Inconsistent or unsupported combinations.
    let sealed = d.mint(&d.cap_args(P1, d.victim, rights::READ), true);
    d.attack("PRIVACY_ARGS without INTEGRITY_ARGS", &frame(&plain, PA, &read), Status::ProtectionUnsupported);
    d.attack("INTEGRITY_DATA without INTEGRITY_ARGS", &frame(&plain, ID, &read), Status::ProtectionUnsupported);
    d.attack("PRIVACY_DATA without INTEGRITY_DATA", &frame(&plain, IA | PD, &read), Status::ProtectionUnsupported);
    d.attack("PRIVACY_CAPABILITY without INTEGRITY_ARGS", &frame(&sealed, PC, &read), Status::ProtectionUnsupported);
    d.attack("drive key without INTEGRITY_ARGS", &frame(&d.dk(), NONE, &getattr(&d)), Status::ProtectionUnsupported);
    d.attack(
        "partition key without INTEGRITY_ARGS",
        &frame(&d.pk(P1), NONE, &min(P1, NONE)),
        Status::ProtectionUnsupported,
    );
    d.attack(
        "key type NONE claiming INTEGRITY_ARGS",
        &frame(&Cred::None, IA, &getattr(&d)),
        Status::ProtectionUnsupported,
    );
    d.attack("key type NONE reading an object", &frame(&Cred::None, NONE, &read), Status::WrongKeyType);
    d.attack(
        "key type NONE writing an object",
        &frame_data(&Cred::None, NONE, &d.write_req(0, 10), &[1; 10]),
        Status::WrongKeyType,
    );
    let mut f = frame(&plain, IA, &read);
    f.bytes[17] = 0x41;
    let mut c = Conn::open(d.addr());
    let rep = c.send(&f);
    assert_eq!(rep.status(), Status::MalformedFrame, "undefined protection bit");
    c.assert_closed("undefined protection bit");
    d.cases.borrow_mut().push("undefined protection bit in the header (MALFORMED_FRAME, closed)".into());
    d.verify("undefined protection bit");

    // NO_PROTECTION: the digest field carries the capability key (a bearer
    // proof), allowed only if capability, partition and drive minimums are NONE.
    let bearer = d.cap(rights::READ | rights::GETATTR, |a| a.min_protection = prot(NONE));
    d.attack("bearer under the default drive minimum", &frame(&bearer, NONE, &read), Status::CapabilityBelowMinimum);
    d.attack("bearer use of a capability whose minimum is IA", &frame(&plain, NONE, &read), Status::ProtectionTooWeak);
    d.expect_ok("drive minimum lowered to NONE", &frame(&d.dk(), IA, &min(0, NONE)));
    let rep = d.control(
        "bearer when capability, partition and drive minimums are NONE (control)",
        &frame(&bearer, NONE, &read),
    );
    assert!(rep.data == d.victim_content()[..100]);
    d.attack("bearer with a wrong key", &frame(&bearer.with_key(Key::random()), NONE, &read), Status::BadDigest);
    d.attack(
        "bearer of an IA capability with every minimum NONE",
        &frame(&plain, NONE, &read),
        Status::ProtectionTooWeak,
    );
    d.attack(
        "drive key with no protection, drive minimum NONE",
        &frame(&d.dk(), NONE, &getattr(&d)),
        Status::ProtectionUnsupported,
    );
    d.expect_ok("partition minimum raised to IA", &frame(&d.pk(P1), IA, &min(P1, IA)));
    d.attack(
        "bearer after the partition minimum is raised",
        &frame(&bearer, NONE, &read),
        Status::CapabilityBelowMinimum,
    );
    let mut p2b = d.cap_args(P2, p2_object, rights::READ);
    p2b.min_protection = prot(NONE);
    let p2_bearer = d.mint(&p2b, false);
    d.control("bearer in a partition whose minimum is NONE (control)", &frame(&p2_bearer, NONE, &p2_read));
    d.expect_ok("drive minimum back to IA", &frame(&d.dk(), IA, &min(0, IA)));
    d.attack(
        "bearer after the drive minimum is raised again",
        &frame(&p2_bearer, NONE, &p2_read),
        Status::CapabilityBelowMinimum,
    );
    d.finish("protection downgrades");
}

// ====================================================================
// 8. Working key rotation and revocation by access control version.
// ====================================================================

#[test]
fn key_rotation_and_revocation() {
    let d = Drive::start();
    let read = read_first(&d);
    let v1 = d.cap(rights::READ | rights::WRITE | rights::GETATTR, |_| {});
    let v1_sealed = d.mint(&d.cap_args(P1, d.victim, rights::READ), true);
    d.control("version 1 capability (control)", &frame(&v1, IA, &read));
    d.rotate(P1, 2);
    d.control("version 1 capability after one rotation: previous key still valid", &frame(&v1, IA, &read));
    d.control("sealed version 1 capability after one rotation", &frame(&v1_sealed, IA | PC, &read));
    let v2 = d.cap(rights::READ, |_| {});
    d.control("version 2 capability", &frame(&v2, IA, &read));
    d.rotate(P1, 3);
    d.attack("version 1 capability after two rotations", &frame(&v1, IA, &read), Status::KeyVersionRetired);
    d.attack(
        "sealed version 1 capability after two rotations",
        &frame(&v1_sealed, IA | PC, &read),
        Status::KeyVersionRetired,
    );
    let late = d.cap(rights::READ, |a| a.key_version = 1);
    d.attack(
        "capability minted now with the retired version 1 key",
        &frame(&late, IA, &read),
        Status::KeyVersionRetired,
    );
    let retired = Cred::Working(P1, 1, d.working_key(P1, 1).unwrap());
    d.attack("retired working key used directly", &frame(&retired, IA, &getattr(&d)), Status::KeyVersionRetired);
    d.control("version 2 capability after two rotations (previous)", &frame(&v2, IA, &read));
    d.control("version 3 capability", &frame(&d.cap(rights::READ, |_| {}), IA, &read));
    d.attack(
        "capability naming a version never set",
        &frame(&d.cap(rights::READ, |a| a.key_version = 4), IA, &read),
        Status::KeyVersionRetired,
    );

    // Revocation: the manager changes the object's ACV.
    let old = d.cap(rights::READ | rights::WRITE | rights::GETATTR, |_| {});
    let old_sealed = d.mint(&d.cap_args(P1, d.victim, rights::READ), true);
    d.control("capability before revocation (control)", &frame(&old, IA, &read));
    let bump = setattr(&d, AttrMask::ACCESS_CONTROL_VERSION, |a| a.access_control_version = 1);
    d.expect_ok("manager (partition key) sets the ACV", &frame(&d.pk(P1), IA, &bump));
    d.snapshot();
    assert_eq!(d.victim_attrs().access_control_version, 1);
    d.attack("read with a capability revoked by the ACV", &frame(&old, IA, &read), Status::AccessRevoked);
    d.attack(
        "write with a capability revoked by the ACV",
        &frame_data(&old, IA, &d.write_req(0, 10), &[7; 10]),
        Status::AccessRevoked,
    );
    d.attack("sealed capability revoked by the ACV", &frame(&old_sealed, IA | PC, &read), Status::AccessRevoked);
    let fresh = d.cap(rights::READ, |_| {});
    d.control("capability minted with the new ACV (control)", &frame(&fresh, IA, &read));
    let owner = d.cap(rights::READ | rights::SETATTR | rights::SET_ACV, |_| {});
    let bump2 = setattr(&d, AttrMask::ACCESS_CONTROL_VERSION, |a| a.access_control_version = 2);
    d.expect_ok("a SET_ACV capability changes the ACV", &frame(&owner, IA, &bump2));
    d.snapshot();
    d.attack("the revoking capability itself afterwards", &frame(&owner, IA, &read), Status::AccessRevoked);
    d.attack("the ACV 1 capability after the ACV became 2", &frame(&fresh, IA, &read), Status::AccessRevoked);
    let bump5 = setattr(&d, AttrMask::ACCESS_CONTROL_VERSION, |a| a.access_control_version = 5);
    d.attack(
        "partition 2's manager setting a partition 1 object's ACV",
        &frame(&d.pk(P2), IA, &bump5),
        Status::WrongObject,
    );
    d.control("capability with ACV 2 (control)", &frame(&d.cap(rights::READ, |_| {}), IA, &read));
    d.finish("key rotation and revocation");
}

// ====================================================================
// 9. Key management with the wrong keys.
// ====================================================================

#[test]
fn key_management_with_wrong_keys_is_refused() {
    let d = Drive::start();
    let new_key = Key::random();
    let master = Cred::Master(d.master.clone());
    let ctx = |op: u16, p: u64, v: u32| key_context(op, p, v);
    let sealed_drive = seal_key(&d.master, &ctx(opcode::SET_DRIVE_KEY, 0, 0), &new_key);
    let set_drive = |sealed_key: Vec<u8>| Request::SetDriveKey { sealed_key };
    d.attack(
        "setdrivekey under a wrong master key",
        &frame(&Cred::Master(Key::random()), IA, &set_drive(sealed_drive.clone())),
        Status::BadDigest,
    );
    d.attack(
        "setdrivekey with the drive key",
        &frame(&d.dk(), IA, &set_drive(sealed_drive.clone())),
        Status::WrongKeyType,
    );
    d.attack(
        "setdrivekey with a key sealed under another master",
        &frame(&master, IA, &set_drive(seal_key(&Key::random(), &ctx(opcode::SET_DRIVE_KEY, 0, 0), &new_key))),
        Status::BadSealedKey,
    );
    d.attack(
        "setdrivekey with a key sealed for setpartitionkey",
        &frame(&master, IA, &set_drive(seal_key(&d.master, &ctx(opcode::SET_PARTITION_KEY, 0, 0), &new_key))),
        Status::BadSealedKey,
    );
    d.attack(
        "setdrivekey with a truncated sealed key",
        &frame(&master, IA, &set_drive(sealed_drive[1..].to_vec())),
        Status::BadSealedKey,
    );
    d.attack(
        "master key without INTEGRITY_ARGS",
        &frame(&master, NONE, &set_drive(sealed_drive.clone())),
        Status::ProtectionUnsupported,
    );
    let req = set_drive(sealed_drive.clone());
    let f = build(&master, IA, &[1; 8], req.opcode(), &req.encode_args(), &[], fresh_nonce());
    d.attack("master key with a key selector", &f, Status::BadCapability);

    let set_part = |partition: u64, sealed_key: Vec<u8>| Request::SetPartitionKey { partition, sealed_key };
    let for_p2 = seal_key(&d.drive_key, &ctx(opcode::SET_PARTITION_KEY, P2, 0), &new_key);
    d.attack(
        "setpartitionkey with a key sealed for another partition",
        &frame(&d.dk(), IA, &set_part(P1, for_p2.clone())),
        Status::BadSealedKey,
    );
    let under_master = seal_key(&d.master, &ctx(opcode::SET_PARTITION_KEY, P1, 0), &new_key);
    d.attack(
        "setpartitionkey with a key sealed under the master key",
        &frame(&d.dk(), IA, &set_part(P1, under_master)),
        Status::BadSealedKey,
    );
    let proper = seal_key(&d.drive_key, &ctx(opcode::SET_PARTITION_KEY, P1, 0), &new_key);
    d.attack(
        "setpartitionkey with a partition key",
        &frame(&d.pk(P1), IA, &set_part(P1, proper.clone())),
        Status::WrongKeyType,
    );
    d.attack(
        "setpartitionkey with a wrong drive key",
        &frame(&Cred::Drive(Key::random()), IA, &set_part(P1, proper)),
        Status::BadDigest,
    );

    let set_working = |partition: u64, key_version: u32, sealed_key: Vec<u8>| Request::SetWorkingKey {
        partition,
        key_version,
        sealed_key,
    };
    let pk1 = &d.pkeys[&P1];
    let sealed_v = |p: u64, v: u32| seal_key(pk1, &ctx(opcode::SET_WORKING_KEY, p, v), &new_key);
    d.attack(
        "setworkingkey with the current version",
        &frame(&d.pk(P1), IA, &set_working(P1, 1, sealed_v(P1, 1))),
        Status::BadArguments,
    );
    d.attack(
        "setworkingkey with version 0",
        &frame(&d.pk(P1), IA, &set_working(P1, 0, sealed_v(P1, 0))),
        Status::BadArguments,
    );
    d.attack(
        "setworkingkey sealed for version 5, sent as version 6",
        &frame(&d.pk(P1), IA, &set_working(P1, 6, sealed_v(P1, 5))),
        Status::BadSealedKey,
    );
    d.attack(
        "setworkingkey sealed for partition 2, sent for partition 1",
        &frame(&d.pk(P1), IA, &set_working(P1, 2, sealed_v(P2, 2))),
        Status::BadSealedKey,
    );
    let sealed_p2 = seal_key(&d.pkeys[&P2], &ctx(opcode::SET_WORKING_KEY, P1, 2), &new_key);
    d.attack(
        "setworkingkey for partition 1 with partition 2's key",
        &frame(&d.pk(P2), IA, &set_working(P1, 2, sealed_p2.clone())),
        Status::WrongObject,
    );
    let impostor = Cred::Partition(P1, d.pkeys[&P2].clone());
    d.attack(
        "partition 1's key selector with partition 2's key",
        &frame(&impostor, IA, &set_working(P1, 2, sealed_p2)),
        Status::BadDigest,
    );
    let w1 = Cred::Working(P1, 1, d.working_key(P1, 1).unwrap());
    d.attack(
        "setworkingkey with a working key",
        &frame(&w1, IA, &set_working(P1, 2, sealed_v(P1, 2))),
        Status::WrongKeyType,
    );
    let all = d.cap(rights::ALL, |a| a.object = nasd_proto::ANY_OBJECT);
    d.attack(
        "setworkingkey with a capability",
        &frame(&all, IA, &set_working(P1, 2, sealed_v(P1, 2))),
        Status::WrongKeyType,
    );
    let nokeys = Cred::Partition(P_NO_KEYS, Key::random());
    let req = Request::SetMinProtection { partition: P_NO_KEYS, protection: prot(IA) };
    d.attack("partition key of a partition that has none", &frame(&nokeys, IA, &req), Status::KeyNotSet);
    let req = Request::SetMinProtection { partition: P1, protection: prot(IA) };
    let f = build(&d.pk(P1), IA, &[1, 0, 0, 0], req.opcode(), &req.encode_args(), &[], fresh_nonce());
    d.attack("partition key selector of the wrong length", &f, Status::BadCapability);

    let data = pattern(9, 10);
    d.attack("getattr with the master key", &frame(&master, IA, &getattr(&d)), Status::WrongKeyType);
    d.attack(
        "write with the master key",
        &frame_data(&master, IA | ID, &d.write_req(0, 10), &data),
        Status::WrongKeyType,
    );
    d.attack("getattr in partition 1 with partition 2's key", &frame(&d.pk(P2), IA, &getattr(&d)), Status::WrongObject);
    let w2 = Cred::Working(P2, 1, d.working_key(P2, 1).unwrap());
    d.attack(
        "write in partition 1 with partition 2's working key",
        &frame_data(&w2, IA | ID, &d.write_req(0, 10), &data),
        Status::WrongObject,
    );
    d.attack(
        "remove in partition 1 with partition 2's key",
        &frame(&d.pk(P2), IA, &Request::Remove { partition: P1, object: d.victim }),
        Status::WrongObject,
    );
    d.attack(
        "readaudit with a partition key",
        &frame(&d.pk(P1), IA, &Request::ReadAudit { after: 0, max: 10 }),
        Status::WrongKeyType,
    );
    d.attack(
        "readaudit with a capability",
        &frame(&all, IA, &Request::ReadAudit { after: 0, max: 10 }),
        Status::WrongKeyType,
    );
    d.attack(
        "drive minimum set with a partition key",
        &frame(&d.pk(P1), IA, &Request::SetMinProtection { partition: 0, protection: prot(NONE) }),
        Status::WrongKeyType,
    );
    d.attack(
        "removepartition with the partition's own key",
        &frame(&d.pk(P1), IA, &Request::RemovePartition { partition: P1, force: true }),
        Status::WrongKeyType,
    );
    d.attack(
        "removepartition with a capability with every right",
        &frame(&all, IA, &Request::RemovePartition { partition: P1, force: true }),
        Status::WrongKeyType,
    );
    let init = Request::Initialize { clock_ns: 0, clock_skew_ns: SKEW_NS, sealed_master_key: Vec::new() };
    d.attack("initialize with the drive key", &frame(&d.dk(), IA, &init), Status::WrongKeyType);
    d.attack("initialize with a partition key", &frame(&d.pk(P1), IA, &init), Status::WrongKeyType);
    d.attack(
        "createpartition with a partition key",
        &frame(&d.pk(P1), IA, &Request::CreatePartition { partition: 7 }),
        Status::WrongKeyType,
    );

    // Every key is as it was.
    d.control("drive key unchanged (control)", &frame(&d.dk(), IA, &getattr(&d)));
    d.control("partition key unchanged (control)", &frame(&d.pk(P1), IA, &getattr(&d)));
    d.control("working key 1 still current (control)", &frame(&d.cap(rights::READ, |_| {}), IA, &read_first(&d)));
    d.attack(
        "no working key 2 was set",
        &frame(&d.cap(rights::READ, |a| a.key_version = 2), IA, &read_first(&d)),
        Status::KeyVersionRetired,
    );
    d.attack(
        "no working key 6 was set",
        &frame(&d.cap(rights::READ, |a| a.key_version = 6), IA, &read_first(&d)),
        Status::KeyVersionRetired,
    );
    d.finish("key management with wrong keys");
}

// ====================================================================
// 10. Oversized, malformed and sealed capabilities.
// ====================================================================

#[test]
fn malformed_oversized_and_sealed_capabilities() {
    let d = Drive::start();
    let read = read_first(&d);
    let cap = d.cap(rights::READ | rights::GETATTR, |_| {});

    for (name, len) in
        [("capability_len one over CAPABILITY_LEN_MAX", CAPABILITY_LEN_MAX + 1), ("capability_len 65535", 65535)]
    {
        let f = frame(&cap, IA, &read);
        let mut h = f.header.clone();
        h.capability_len = len as u16;
        let mut c = Conn::open(d.addr());
        std::io::Write::write_all(&mut c.0, &h.encode()).unwrap();
        let w = read_wire(&mut c.0).expect("a reply before the close");
        assert_eq!(w.header.status, Status::LimitExceeded as u16, "{name}");
        c.assert_closed(name);
        d.cases.borrow_mut().push(format!("{name} (LIMIT_EXCEEDED, connection closed)"));
        d.verify(name);
    }

    let token = cap.token().to_vec();
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut t = token.clone();
        f(&mut t);
        t
    };
    let edited = |f: &dyn Fn(&mut CapabilityArgs)| {
        let mut a = cap.args().clone();
        f(&mut a);
        a.encode().to_vec()
    };
    let mut maxlen = vec![0u8; CAPABILITY_LEN_MAX];
    maxlen[0] = 1;
    let malformed: Vec<(&str, Vec<u8>)> = vec![
        ("capability one byte short", token[..token.len() - 1].to_vec()),
        ("capability one byte long", with(&|t| t.push(0))),
        ("capability format byte 0", with(&|t| t[0] = 0)),
        ("capability format byte 0xff", with(&|t| t[0] = 0xff)),
        ("sealed format byte on a clear capability", with(&|t| t[0] = nasd_proto::CAPABILITY_FORMAT_SEALED)),
        ("empty capability with key type CAPABILITY", Vec::new()),
        ("capability of CAPABILITY_LEN_MAX bytes", maxlen),
        ("reserved capability byte set", with(&|t| t[3] = 1)),
        ("unknown MAC algorithm", edited(&|a| a.algorithm = 3)),
        ("undefined rights bit", edited(&|a| a.rights |= 1 << 12)),
        ("capability region beyond OBJECT_SIZE_MAX", edited(&|a| a.region = rg(OBJECT_SIZE_MAX, 1))),
        ("undefined protection bit in the capability minimum", with(&|t| t[2] |= 0x40)),
    ];
    for (name, t) in malformed {
        let f = build(&cap, IA, &t, read.opcode(), &read.encode_args(), &[], fresh_nonce());
        d.attack(name, &f, Status::BadCapability);
    }
    // The connection goes on after a malformed capability.
    let mut c = Conn::open(d.addr());
    let bad = build(&cap, IA, &token[1..], read.opcode(), &read.encode_args(), &[], fresh_nonce());
    assert_eq!(c.send(&bad).status(), Status::BadCapability);
    let good = frame(&cap, IA, &read);
    let rep = c.send(&good);
    d.judge("the same connection works after a malformed capability", &good, &rep, Status::Ok);
    d.record(&bad, Status::BadCapability);
    d.cases.borrow_mut().push("the same connection works after a malformed capability".into());

    // Sealed capabilities (PRIVACY_CAPABILITY).
    let sargs = d.cap_args(P1, d.victim, rights::READ | rights::GETATTR);
    let sealed = d.mint(&sargs, true);
    let rep = d.control("sealed capability under PRIVACY_CAPABILITY (control)", &frame(&sealed, IA | PC, &read));
    assert!(rep.data == d.victim_content()[..100]);
    let st = sealed.token().to_vec();
    let swith = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut t = st.clone();
        f(&mut t);
        sealed.with_token(t, sargs.clone())
    };
    let n = st.len();
    let p1_working = d.working_key(P1, 1).unwrap();
    let p2_working = d.working_key(P2, 1).unwrap();
    let (under_p2, _) = mint_capability(&p2_working, &sargs, true).unwrap();
    let mut inner = sargs.clone();
    inner.partition = P2;
    let prefix = SealedCapabilityPrefix { key_version: 1, partition: P1 }.encode();
    let mut mismatched = prefix.to_vec();
    mismatched.extend_from_slice(&seal(&p1_working.derive("nasd v1 capability seal"), &prefix, &inner.encode()));
    let tampered: Vec<(&str, Cred, Status)> = vec![
        ("sealed capability: nonce byte flipped", swith(&|t| t[16] ^= 1), Status::BadCapability),
        ("sealed capability: ciphertext byte flipped", swith(&|t| t[16 + 24 + 5] ^= 1), Status::BadCapability),
        ("sealed capability: tag byte flipped", swith(&|t| t[n - 1] ^= 1), Status::BadCapability),
        ("sealed capability: reserved prefix byte set", swith(&|t| t[1] = 1), Status::BadCapability),
        (
            "sealed capability: prefix partition changed to partition 2",
            swith(&|t| t[8..16].copy_from_slice(&P2.to_le_bytes())),
            Status::BadCapability,
        ),
        (
            "sealed capability: prefix key version changed to 9",
            swith(&|t| t[4..8].copy_from_slice(&9u32.to_le_bytes())),
            Status::KeyVersionRetired,
        ),
        (
            "sealed capability: one byte short",
            swith(&|t| {
                t.pop();
            }),
            Status::BadCapability,
        ),
        ("sealed capability: one byte long", swith(&|t| t.push(0)), Status::BadCapability),
        (
            "sealed capability: sealed under partition 2's working key",
            sealed.with_token(under_p2, sargs.clone()),
            Status::BadCapability,
        ),
        (
            "sealed capability: inner partition differs from the prefix",
            sealed.with_token(mismatched, sargs.clone()),
            Status::BadCapability,
        ),
    ];
    for (name, cred, want) in tampered {
        d.attack(name, &frame(&cred, IA | PC, &read), want);
    }
    let other = d.mint(&d.cap_args(P1, d.victim, rights::ALL), true);
    let spliced = sealed.with_token(other.token().to_vec(), other.args().clone());
    d.attack(
        "another capability's sealed token with this capability's key",
        &frame(&spliced, IA | PC, &read),
        Status::BadDigest,
    );
    d.finish("malformed, oversized and sealed capabilities");
}

// ====================================================================
// 11. Tampered replies are detected by the client.
// ====================================================================

#[test]
fn tampered_replies_are_detected_by_the_client() {
    let d = Drive::start();
    let proxy = Proxy::start(d.addr());
    let cap = d.cap(rights::READ | rights::GETATTR, |a| a.min_protection = prot(IA | ID));
    let victim = d.victim;
    let getattr_via = |cred: &Cred, protection: u8, t: Option<Tamper>| -> Result<Attributes, ClientError> {
        proxy.set(t);
        let (addr, cred) = (proxy.addr, cred.client());
        d.rt.block_on(async move {
            let mut c = client_as(addr, cred, protection).await?;
            to(c.getattr(P1, victim)).await
        })
    };
    let read_via = |cred: &Cred, protection: u8, t: Option<Tamper>| -> Result<Vec<u8>, ClientError> {
        proxy.set(t);
        let (addr, cred) = (proxy.addr, cred.client());
        d.rt.block_on(async move {
            let mut c = client_as(addr, cred, protection).await?;
            Ok(to(c.read(P1, victim, &[rg(0, VICTIM_LEN as u64)])).await?.1)
        })
    };
    // The same read streamed to a buffer: (result, what reached the buffer).
    let read_to_via = |cred: &Cred, protection: u8, t: Option<Tamper>| -> (Result<(), ClientError>, Vec<u8>) {
        proxy.set(t);
        let (addr, cred) = (proxy.addr, cred.client());
        d.rt.block_on(async move {
            let mut out = Vec::new();
            let r = async {
                let mut c = client_as(addr, cred, protection).await?;
                to(c.read_to(P1, victim, &[rg(0, VICTIM_LEN as u64)], &mut out)).await.map(drop)
            }
            .await;
            (r, out)
        })
    };

    // Baseline through the proxy, then every byte of a getattr reply flipped.
    proxy.clear();
    assert_eq!(getattr_via(&cap, IA | ID, None).expect("untampered getattr"), d.victim_attrs());
    let lengths = reply_frame_lengths(&proxy.captured().1);
    assert_eq!(lengths.len(), 2, "hello and getattr replies");
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for offset in 0..lengths[1] {
        match getattr_via(&cap, IA | ID, Some(Tamper::Xor { frame: 1, offset, mask: 0x01 })) {
            Ok(a) => panic!("reply byte {offset} flipped: the client accepted {a:?}"),
            Err(ClientError::BadReply(_)) => *tally.entry("BadReply".into()).or_default() += 1,
            Err(e) => {
                let authenticated_field = (6..16).contains(&offset) || (18..20).contains(&offset) || offset >= 40;
                assert!(!authenticated_field, "reply byte {offset}: expected BadReply, got {e}");
                *tally.entry(format!("{}", e).split(':').next().unwrap().to_string()).or_default() += 1;
            }
        }
    }
    eprintln!("getattr reply byte flips: {tally:?}");
    d.cases.borrow_mut().push(format!("getattr reply: each of its {} bytes flipped (never accepted; BadReply for id, opcode, status, nonce, results, digest)", lengths[1]));
    d.verify("getattr reply byte flips");

    // A refusal turned into a success, a success into a refusal.
    let ro = d.cap(rights::READ | rights::GETATTR, |a| a.min_protection = prot(IA | ID));
    let write_via = |t: Option<Tamper>| -> Result<u64, ClientError> {
        proxy.set(t);
        let (addr, cred) = (proxy.addr, ro.client());
        d.rt.block_on(async move {
            let mut c = client_as(addr, cred, IA | ID).await?;
            to(c.write(P1, victim, &[rg(0, 10)], &[1; 10])).await
        })
    };
    match write_via(None) {
        Err(ClientError::Status { status: Status::RightsInsufficient, .. }) => {}
        other => panic!("untampered refused write: {other:?}"),
    }
    let to_ok = Tamper::Xor { frame: 1, offset: 18, mask: Status::RightsInsufficient as u8 };
    assert!(
        matches!(write_via(Some(to_ok)), Err(ClientError::BadReply(_))),
        "a refusal rewritten as success was believed"
    );
    d.cases.borrow_mut().push("refusal reply rewritten to OK (BadReply)".into());
    let to_refusal = Tamper::Xor { frame: 1, offset: 18, mask: Status::AccessRevoked as u8 };
    assert!(matches!(getattr_via(&cap, IA | ID, Some(to_refusal)), Err(ClientError::BadReply(_))));
    d.cases.borrow_mut().push("success reply rewritten to an authenticated-looking refusal (BadReply)".into());

    // Read replies: data, tags and results.
    for (label, protection) in [
        ("INTEGRITY_DATA", IA | ID),
        ("INTEGRITY_DATA+HASH_AND_MAC", IA | ID | HM),
        ("PRIVACY_ARGS+PRIVACY_DATA", IA | ID | PA | PD),
    ] {
        let c = d.cap(rights::READ, |a| a.min_protection = prot(protection));
        proxy.clear();
        assert!(read_via(&c, protection, None).expect("untampered read") == d.victim_content());
        let len = reply_frame_lengths(&proxy.captured().1)[1];
        let (chunk, tag) = (REPLY_CHUNK as usize, 32);
        let data_at = HEADER_LEN + 2 + 8 + 32;
        assert_eq!(len, data_at + VICTIM_LEN + VICTIM_LEN.div_ceil(chunk) * tag);
        for (what, offset) in [
            ("read lengths", HEADER_LEN + 3),
            ("first data byte", data_at),
            ("first tag", data_at + chunk),
            ("a middle chunk", data_at + 5 * (chunk + tag) + 7),
            ("last data byte", len - tag - 1),
            ("last tag byte", len - 1),
        ] {
            let flip = Tamper::Xor { frame: 1, offset, mask: 0x04 };
            // A data tag of a Hash-and-MAC read fails as HashAndMacMismatch
            // (it could also be rot on the drive); everything else as BadReply.
            let expected = |e: Option<&ClientError>| match e {
                Some(ClientError::HashAndMacMismatch(_)) => protection & HM != 0 && offset >= data_at,
                Some(ClientError::BadReply(_)) => protection & HM == 0 || offset < data_at,
                _ => false,
            };
            let r = read_via(&c, protection, Some(flip));
            assert!(expected(r.as_ref().err()), "{label} read reply, {what} flipped: {:?}", r.map(|v| v.len()));
            // Streamed, the reader gets exactly the chunks before the flipped
            // one, unaltered: nothing unverified is handed over.
            let (r, got) = read_to_via(&c, protection, Some(flip));
            assert!(expected(r.as_ref().err()), "{label} read_to, {what} flipped: {r:?}");
            let verified = if offset < data_at { 0 } else { (offset - data_at) / (chunk + tag) * chunk };
            assert!(
                got == d.victim_content()[..verified],
                "{label} read_to, {what} flipped: {} bytes handed over",
                got.len()
            );
            d.cases.borrow_mut().push(format!(
                "{label} read reply: {what} flipped (refused; only the {verified} bytes of earlier chunks handed over)"
            ));
        }
    }

    // A reply replayed in answer to a later request.
    proxy.set(Some(Tamper::ReplayPrevious { frame: 2 }));
    let (addr, cred) = (proxy.addr, cap.client());
    let second = d.rt.block_on(async move {
        let mut c = client_as(addr, cred, IA | ID).await.expect("connect");
        to(c.getattr(P1, victim)).await.expect("first getattr");
        to(c.getattr(P1, victim)).await
    });
    assert!(matches!(second, Err(ClientError::BadReply(_))), "a replayed reply was believed: {second:?}");
    d.cases.borrow_mut().push("earlier reply replayed for a later request (BadReply)".into());
    d.verify("tampered replies");
    d.finish("tampered replies");
}

/// The HELLO reply is unauthenticated (no key is known yet). A man in the
/// middle who changes its sizes can only make calls fail: a block size or
/// chunk limit outside the protocol's limits is refused at connect (once, a
/// chunk limit of 0 made the client divide by zero on its first write); a
/// wrong but valid block size cuts Hash-and-MAC units where the drive does
/// not, so those reads fail their tags, and nothing else depends on it.
#[test]
fn hello_sizes_changed_in_flight_only_cause_failures() {
    let d = Drive::start();
    let proxy = Proxy::start(d.addr());
    let victim = d.victim;
    // HELLO reply arguments: version (0), drive id (1), chunk_len_max (17), regions_max (21), block_size (23).
    let (chunk_len_max_at, block_size_at) = (HEADER_LEN + 17, HEADER_LEN + 23);
    let connect = |t: Tamper| {
        proxy.set(Some(t));
        let addr = proxy.addr;
        d.rt.block_on(async move { to(nasd_client::DriveClient::connect(addr)).await })
    };
    for (what, t) in [
        ("block size 4097", Tamper::XorAndGoOn { frame: 0, offset: block_size_at, mask: 0x01 }),
        ("block size 2 MiB + 4 KiB", Tamper::XorAndGoOn { frame: 0, offset: block_size_at + 2, mask: 0x20 }),
        ("chunk limit 0", Tamper::XorAndGoOn { frame: 0, offset: chunk_len_max_at + 2, mask: 0x40 }),
    ] {
        match connect(t) {
            Err(ClientError::Protocol(m)) => assert!(m.contains("HELLO"), "{what}: {m}"),
            other => panic!("{what}: {other:?}"),
        }
        d.cases.borrow_mut().push(format!("HELLO reply changed in flight to {what}: refused at connect (Protocol)"));
    }
    // 4096 → 8192: a valid block size, but not the drive's.
    let to_8k = Tamper::XorAndGoOn { frame: 0, offset: block_size_at + 1, mask: 0x30 };
    for (label, bits) in [("INTEGRITY_DATA", IA | ID), ("INTEGRITY_DATA+HASH_AND_MAC", IA | ID | HM)] {
        let cred = d.cap(rights::READ, |a| a.min_protection = prot(bits)).client();
        proxy.set(Some(to_8k));
        let addr = proxy.addr;
        let r = d.rt.block_on(async move {
            let mut c = client_as(addr, cred, bits).await?;
            Ok::<_, ClientError>(to(c.read(P1, victim, &[rg(100, VICTIM_LEN as u64 - 100)])).await?.1)
        });
        if bits & HM != 0 {
            assert!(matches!(r, Err(ClientError::HashAndMacMismatch(_))), "{label}: {:?}", r.map(|v| v.len()));
        } else {
            assert!(r.expect("the block size plays no part in per-byte MACs") == d.victim_content()[100..]);
        }
        d.cases.borrow_mut().push(format!(
            "HELLO block size 4096 changed to 8192 in flight: {label} read {}",
            if bits & HM != 0 { "fails its tags (HashAndMacMismatch)" } else { "unaffected" }
        ));
    }
    d.verify("HELLO sizes changed in flight");
    d.finish("HELLO sizes changed in flight");
}

// ====================================================================
// 12. Every protection option round-trips; privacy hides the plaintext.
// ====================================================================

#[test]
fn every_protection_option_round_trips_and_privacy_hides_plaintext() {
    let d = Drive::start();
    // The objects live in partition 2, so partition 1 (the victim's) must
    // not change at all.
    let proxy = Proxy::start(d.addr());
    let options: [(&str, u8, MacAlgorithm); 9] = [
        ("INTEGRITY_ARGS", IA, MacAlgorithm::Blake3),
        ("INTEGRITY_ARGS+INTEGRITY_DATA", IA | ID, MacAlgorithm::Blake3),
        ("INTEGRITY_ARGS+PRIVACY_ARGS", IA | PA, MacAlgorithm::Blake3),
        ("INTEGRITY_ARGS+INTEGRITY_DATA+PRIVACY_DATA", IA | ID | PD, MacAlgorithm::Blake3),
        ("INTEGRITY_ARGS+INTEGRITY_DATA+PRIVACY_ARGS+PRIVACY_DATA", IA | ID | PA | PD, MacAlgorithm::Blake3),
        ("INTEGRITY_ARGS+PRIVACY_CAPABILITY", IA | PC, MacAlgorithm::Blake3),
        ("every option", ALL, MacAlgorithm::Blake3),
        ("every option, HMAC-SHA-256", ALL, MacAlgorithm::HmacSha256),
        ("INTEGRITY_ARGS, HMAC-SHA-256", IA, MacAlgorithm::HmacSha256),
    ];
    for (i, (name, bits, alg)) in options.into_iter().enumerate() {
        let object = d.create_object(P2, &[]);
        let fs: [u8; 256] = pattern(100 + i as u64, 256).try_into().unwrap();
        let set_fs = Request::SetAttr {
            partition: P2,
            object,
            mask: AttrMask::FS_SPECIFIC,
            attrs: Attributes { fs_specific: fs, ..Attributes::default() },
        };
        d.ok(&d.dk(), IA, &set_fs);
        let mut args = d.cap_args(P2, object, rights::READ | rights::WRITE | rights::GETATTR);
        args.min_protection = prot(bits);
        args.algorithm = alg as u8;
        let cred = d.mint(&args, bits & PC != 0);
        let data = pattern(200 + i as u64, 8192);
        proxy.set(None);
        proxy.clear();
        let (addr, client_cred, sent) = (proxy.addr, cred.client(), data.clone());
        let (back, attrs) = d.rt.block_on(async move {
            let mut c = client_as(addr, client_cred, bits).await.expect("connect");
            assert_eq!(to(c.write(P2, object, &[rg(0, 8192)], &sent)).await.expect("write"), 8192);
            let (_, back) = to(c.read(P2, object, &[rg(0, 8192)])).await.expect("read");
            (back, to(c.getattr(P2, object)).await.expect("getattr"))
        });
        assert!(back == data, "{name}: data did not round-trip");
        assert_eq!(attrs.fs_specific, fs, "{name}: attributes did not round-trip");
        let (up, down) = proxy.captured();
        let (up16, down16) = (windows(&up, 16), windows(&down, 16));
        let seen = |set: &std::collections::HashSet<&[u8]>, plain: &[u8]| {
            plain.chunks_exact(16).filter(|c| set.contains(c)).count()
        };
        let contains = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).any(|w| w == needle);
        let n = data.len() / 16;
        if bits & PD != 0 {
            assert_eq!(
                (seen(&up16, &data), seen(&down16, &data)),
                (0, 0),
                "{name}: PRIVACY_DATA leaked plaintext data on the wire"
            );
        } else {
            assert_eq!(
                (seen(&up16, &data), seen(&down16, &data)),
                (n, n),
                "{name}: control: clear data is on the wire"
            );
        }
        let write_args = Request::Write { partition: P2, object, regions: vec![rg(0, 8192)] }.encode_args();
        assert_eq!(contains(&up, &write_args), bits & PA == 0, "{name}: write arguments on the wire");
        if bits & PA != 0 {
            assert_eq!(seen(&down16, &fs), 0, "{name}: PRIVACY_ARGS leaked the attributes");
        } else {
            assert_eq!(seen(&down16, &fs), 16, "{name}: control: clear attributes are on the wire");
        }
        let clear_token = args.encode();
        assert_eq!(contains(&up, &clear_token), bits & PC == 0, "{name}: clear capability arguments on the wire");
        assert_eq!(contains(&up, &args.audit_id.to_le_bytes()), bits & PC == 0, "{name}: the audit id on the wire");
        d.cases
            .borrow_mut()
            .push(format!("{name}: write+read+getattr round trip; plaintext hidden as the options promise"));
        d.verify(name);
    }

    // NO_PROTECTION, allowed once every minimum is NONE: a bearer proof.
    d.ok(&d.dk(), IA, &Request::SetMinProtection { partition: 0, protection: prot(NONE) });
    let object = d.create_object(P2, &[]);
    let mut args = d.cap_args(P2, object, rights::READ | rights::WRITE);
    args.min_protection = prot(NONE);
    let cred = d.mint(&args, false);
    proxy.clear();
    let data = pattern(300, 4096);
    let (addr, client_cred, sent) = (proxy.addr, cred.client(), data.clone());
    let back = d.rt.block_on(async move {
        let mut c = client_as(addr, client_cred, NONE).await.expect("connect");
        to(c.write(P2, object, &[rg(0, 4096)], &sent)).await.expect("bearer write");
        to(c.read(P2, object, &[rg(0, 4096)])).await.expect("bearer read").1
    });
    assert!(back == data, "NO_PROTECTION round trip");
    let (up, down) = proxy.captured();
    let key = cred.key().unwrap().expose();
    assert!(
        up.windows(32).any(|w| w == key),
        "NO_PROTECTION requests carry the capability key (documented bearer proof)"
    );
    assert!(!down.windows(32).any(|w| w == key), "the drive echoed a capability key in a reply");
    d.cases.borrow_mut().push(
        "NO_PROTECTION bearer round trip (every minimum NONE); the key is in requests as documented, never in replies"
            .into(),
    );
    d.ok(&d.dk(), IA, &Request::SetMinProtection { partition: 0, protection: prot(IA) });
    d.verify("NO_PROTECTION");
    d.finish("protection options");
}

// ====================================================================
// 13. The audit trail.
// ====================================================================

#[test]
fn audit_trail_records_refusals_and_authorizations() {
    let d = Drive::start();
    let t0 = now_ns();
    let ok_cap = d.cap(rights::READ | rights::GETATTR, |_| {});
    let authorized = frame(&ok_cap, IA, &d.read_req(100, 50));
    d.control("authorized read", &authorized);
    let ro = d.cap(rights::READ, |_| {});
    d.attack(
        "write with a read capability",
        &frame_data(&ro, IA | ID, &d.write_req(0, 10), &[1; 10]),
        Status::RightsInsufficient,
    );
    let expired = d.cap(rights::READ, |a| a.expiration_ns = 1);
    d.attack("expired capability", &frame(&expired, IA, &read_first(&d)), Status::CapabilityExpired);
    let forged = d.cap(rights::READ, |_| {}).with_key(Key::random());
    d.attack("forged capability", &frame(&forged, IA, &read_first(&d)), Status::BadDigest);
    d.attack("replayed request", &authorized, Status::NonceReplayed);
    let narrow = d.cap(rights::READ, |a| a.region = rg(0, 10));
    d.attack("region escape", &frame(&narrow, IA, &d.read_req(5, 10)), Status::RegionNotInCapability);
    d.attack(
        "readaudit with a capability",
        &frame(&ok_cap, IA, &Request::ReadAudit { after: 0, max: 10 }),
        Status::WrongKeyType,
    );
    let tagged = d.cap(rights::WRITE, |_| {});
    let mut f = frame_data(&tagged, IA | ID, &d.write_req(0, 10), &[2; 10]);
    let last = f.bytes.len() - 1;
    f.bytes[last] ^= 1;
    d.attack("data changed in flight", &f, Status::BadDataTag);

    let trail = d.check_audit("audit");
    let t1 = now_ns();
    let find = |audit_id: u64, status: Status| {
        trail
            .iter()
            .find(|r| r.audit_id == audit_id && r.status == status as u16)
            .unwrap_or_else(|| panic!("no record with audit id {audit_id} and status {}", status.name()))
    };
    let r = find(ok_cap.audit_id(), Status::Ok);
    assert_eq!((r.opcode, r.key_type, r.partition, r.object, r.region), (opcode::READ, 5, P1, d.victim, rg(100, 50)));
    assert!(t0 <= r.time_ns && r.time_ns <= t1, "record time on the drive clock");
    let r = find(ro.audit_id(), Status::RightsInsufficient);
    assert_eq!((r.opcode, r.partition, r.object, r.region), (opcode::WRITE, P1, d.victim, rg(0, 10)));
    let r = find(expired.audit_id(), Status::CapabilityExpired);
    assert_eq!((r.opcode, r.partition, r.object), (opcode::READ, P1, d.victim));
    let r = find(narrow.audit_id(), Status::RegionNotInCapability);
    assert_eq!(r.region, rg(5, 10));
    assert_eq!(find(ok_cap.audit_id(), Status::WrongKeyType).opcode, opcode::READ_AUDIT);
    assert_eq!(find(tagged.audit_id(), Status::BadDataTag).opcode, opcode::WRITE);
    // Unauthenticated refusals carry no audit id and no target: the drive
    // cannot vouch for anything in them.
    let r = find(0, Status::BadDigest);
    assert_eq!((r.key_type, r.partition, r.object), (5, 0, 0));
    assert!(!trail.iter().any(|r| r.audit_id == forged.audit_id()), "an unauthenticated audit id was recorded");
    // A replay authenticated (its capability is genuine): recorded with the
    // capability's audit id, before its arguments were read (no target).
    let r = find(ok_cap.audit_id(), Status::NonceReplayed);
    assert_eq!((r.opcode, r.key_type, r.partition, r.object), (opcode::READ, 5, 0, 0));

    // READ_AUDIT with a hand-built frame under PRIVACY_ARGS gives the same records.
    let rep = d.send(&frame(&d.dk(), IA | PA, &Request::ReadAudit { after: 0, max: 512 }));
    match rep.reply() {
        Reply::Audit { records } => {
            let n = records.len().min(trail.len());
            assert_eq!(records[..n], trail[..n], "raw readaudit agrees with the client's");
        }
        other => panic!("unexpected readaudit reply {other:?}"),
    }
    d.cases.borrow_mut().push("readaudit under the drive key with PRIVACY_ARGS".into());

    // The trail survives a restart and goes on numbering.
    let last = trail.last().unwrap().sequence;
    d.restart();
    d.attack("forged capability after the restart", &frame(&forged, IA, &read_first(&d)), Status::BadDigest);
    let after = d.audit_trail();
    assert!(after.len() >= trail.len(), "records lost over the restart");
    assert_eq!(after[..trail.len()], trail[..], "records changed over the restart");
    assert!(after.iter().any(|r| r.sequence > last && r.status == Status::BadDigest as u16));
    d.finish("audit trail");
}

// ====================================================================
// 14. Secrets are compared in constant time.
// ====================================================================

/// `==`/`!=` comparisons in `code` where an operand names a digest, MAC,
/// tag or key (`digest == x`, `x != tag`, `key == k`, `a.expose() == b`...).
fn secret_comparisons(code: &str) -> Vec<String> {
    let secret = |operand: &str| {
        let t = operand.trim_matches(|c: char| "&*!(),;{}[]".contains(c));
        let t = t.trim_end_matches("()");
        let last = t.rsplit(['.', ':']).next().unwrap_or(t).trim_end_matches("()").to_ascii_lowercase();
        ["digest", "tag", "mac", "key", "expose", "peek", "finish", "raw", "sealed", "token"].contains(&last.as_str())
            || ["_digest", "_tag", "_mac", "_key"].iter().any(|s| last.ends_with(s))
    };
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let line = line.split("//").next().unwrap();
        for op in ["==", "!="] {
            let mut from = 0;
            while let Some(i) = line[from..].find(op) {
                let at = from + i;
                let left = line[..at].split_whitespace().last().unwrap_or("");
                let right = line[at + 2..].split_whitespace().next().unwrap_or("");
                if secret(left) || secret(right) {
                    found.push(format!("line {}: {}", n + 1, line.trim()));
                }
                from = at + 2;
            }
        }
    }
    found
}

#[test]
fn secrets_are_compared_in_constant_time() {
    // The detector finds what it must.
    for bad in [
        "if digest == expected {",
        "if expected != digest {",
        "tag == t",
        "if key == other",
        "a.expose() == b.expose()",
        "x == frame_key",
    ] {
        assert!(!secret_comparisons(bad).is_empty(), "detector misses {bad:?}");
    }
    for fine in [
        "if header.key_type == KeyType::Master",
        "args.key_version == prefix.key_version",
        "if bytes.len() != LEN",
        "(v != 0).then",
    ] {
        assert!(secret_comparisons(fine).is_empty(), "detector flags {fine:?}");
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut all = Vec::new();
    let files = [
        "crates/drive/src/security.rs",
        "crates/crypto/src/protect.rs",
        "crates/drive/src/conn.rs",
        "crates/crypto/src/lib.rs",
        "crates/crypto/src/mac.rs",
        "crates/crypto/src/seal.rs",
        "crates/crypto/src/key.rs",
        "crates/client/src/auth.rs",
        "crates/crypto/src/handle.rs",
        "crates/manager/src/handles.rs",
        "crates/login/src/passwords.rs",
        "crates/auth/src/lib.rs",
        "crates/auth/src/pg.rs",
        "crates/auth/src/store.rs",
        "crates/manager/src/identity.rs",
    ];
    for file in files {
        let code = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        all.extend(secret_comparisons(&code).into_iter().map(|l| format!("{file} {l}")));
    }
    assert!(
        all.is_empty(),
        "digests, MACs, tags and keys must be compared with nasd_crypto::ct_eq (constant time), not ==/!=:\n{}",
        all.join("\n")
    );
}

// ====================================================================
// 11b. Every byte of read replies and write data flipped, one per request.
// ====================================================================

/// Parallel workers of the exhaustive flip tests (each its own proxy,
/// connection and runtime): the flips are independent requests.
const FLIP_WORKERS: usize = 4;

/// The read and write of the exhaustive flip tests: a partial first unit,
/// two whole blocks, a partial last unit.
fn flip_region() -> Region {
    rg(BLOCK as u64 - 150, 150 + 2 * BLOCK as u64 + 100)
}

/// Runs `flip(worker proxy, runtime, offset)` for every offset in `offsets`,
/// spread over FLIP_WORKERS threads, and sums the tallies they return.
fn flip_in_parallel(
    drive: std::net::SocketAddr,
    offsets: std::ops::Range<usize>,
    flip: impl Fn(&Proxy, &tokio::runtime::Runtime, usize) -> String + Sync,
) -> BTreeMap<String, usize> {
    let tallies: Vec<BTreeMap<String, usize>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..FLIP_WORKERS)
            .map(|w| {
                let (flip, offsets) = (&flip, offsets.clone());
                scope.spawn(move || {
                    let proxy = Proxy::start(drive);
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                    let mut tally = BTreeMap::new();
                    for offset in offsets.skip(w).step_by(FLIP_WORKERS) {
                        *tally.entry(flip(&proxy, &rt, offset)).or_default() += 1;
                    }
                    tally
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("flip worker")).collect()
    });
    let mut sum = BTreeMap::new();
    for t in tallies {
        for (k, v) in t {
            *sum.entry(k).or_default() += v;
        }
    }
    sum
}

/// The error class a flip test tallies.
fn class(e: &ClientError) -> String {
    match e {
        ClientError::Status { status, .. } => status.name().to_string(),
        other => format!("{other}").split(':').next().unwrap_or_default().to_string(),
    }
}

/// Every byte of a read reply — header, results, digest, every data byte and
/// every tag byte — flipped, one flip per request (a new connection each,
/// since a client that saw a bad reply is done), under INTEGRITY_DATA with
/// per-byte MACs and with Hash-and-MAC, with reply chunks of two blocks
/// (whole blocks that fit in a chunk travel by stored digest, one straddles)
/// and of a quarter block (every block straddles). The read has a partial
/// first and last unit. Every flip is refused; no read returns bytes; a flip
/// in the data section is a data-tag failure of the kind the protection
/// implies (BadReply, or HashAndMacMismatch under Hash-and-MAC).
#[test]
fn every_read_reply_byte_flipped_is_detected() {
    for reply_chunk in [2 * BLOCK, REPLY_CHUNK] {
        let d = Drive::start_with_reply_chunk(reply_chunk);
        let content = pattern(0xf11b, 4 * BLOCK as usize);
        let object = d.create_object(P2, &content);
        let region = flip_region();
        let truth = &content[region.offset as usize..region.end() as usize];
        for (label, bits) in [("INTEGRITY_DATA", IA | ID), ("INTEGRITY_DATA+HASH_AND_MAC", IA | ID | HM)] {
            let mut args = d.cap_args(P2, object, rights::READ);
            args.min_protection = prot(bits);
            let cred = d.mint(&args, false).client();
            let read = |addr, rt: &tokio::runtime::Runtime| {
                let cred = cred.clone();
                rt.block_on(async move {
                    let mut c = client_as(addr, cred, bits).await?;
                    Ok::<_, ClientError>(to(c.read(P2, object, &[region])).await?.1)
                })
            };
            let proxy = Proxy::start(d.addr());
            assert!(read(proxy.addr, &d.rt).expect("untampered read") == truth, "{label}");
            let len = reply_frame_lengths(&proxy.captured().1)[1];
            let data_at = HEADER_LEN + 2 + 8 + 32;
            let chunks = truth.len().div_ceil(reply_chunk as usize);
            assert_eq!(len, data_at + truth.len() + chunks * 32, "{label}: one tag per chunk");
            let tally = flip_in_parallel(d.addr(), 0..len, |proxy, rt, offset| {
                proxy.set(Some(Tamper::Xor { frame: 1, offset, mask: 1 << (offset % 8) }));
                let e = match read(proxy.addr, rt) {
                    Ok(v) => {
                        panic!("{label}, chunk {reply_chunk}: reply byte {offset} flipped, {} bytes accepted", v.len())
                    }
                    Err(e) => e,
                };
                if offset >= data_at {
                    let data_tag_failure = if bits & HM != 0 {
                        matches!(e, ClientError::HashAndMacMismatch(_))
                    } else {
                        matches!(e, ClientError::BadReply(_))
                    };
                    assert!(data_tag_failure, "{label}, chunk {reply_chunk}: data byte {offset} flipped: {e}");
                }
                class(&e)
            });
            eprintln!("{label}, reply chunk {reply_chunk}: {len} reply bytes flipped: {tally:?}");
            d.cases.borrow_mut().push(format!(
                "{label} read reply, chunk {reply_chunk}: each of its {len} bytes flipped ({chunks} chunks; never accepted)"
            ));
        }
        d.verify("read reply byte flips");
        d.finish("read reply byte flips");
    }
}

/// Partition P2's and the drive's bytes in use, after a flush (so blocks
/// awaiting release are released).
fn usage(d: &Drive) -> (u64, u64) {
    let dk = d.dk();
    d.ok(&dk, IA, &Request::FlushPartition { partition: P2 });
    match d.ok(&dk, IA, &Request::Inquiry) {
        Reply::Inquiry(info) => {
            let p2 = info.partitions.iter().find(|p| p.partition == P2).expect("P2 listed").used_bytes;
            (info.used_bytes, p2)
        }
        other => panic!("unexpected inquiry reply {other:?}"),
    }
}

/// Reads an object of P2 whole, with the drive key.
fn content_of(d: &Drive, object: u64) -> Vec<u8> {
    let req = Request::Read { partition: P2, object, regions: vec![rg(0, 1 << 20)] };
    d.ok_data(&d.dk(), IA | ID, &req, &[]).data
}

/// Every byte of a write's data section — every data byte and every tag
/// byte — flipped, one flip per request (many requests per connection: a
/// refusal leaves the connection usable), under INTEGRITY_DATA and with
/// HASH_AND_MAC set on the request too (request data keeps per-byte tags).
/// The write has a partial first and last block and seventeen 512-byte
/// chunks, so flips in later chunks come after earlier chunks verified and
/// went into new blocks. Every write is refused with BAD_DATA_TAG; the object reads back
/// unchanged and no block is leaked. Then the explicit case: a long write
/// whose last chunk is tampered after blocks of it were already stored.
#[test]
fn every_write_data_byte_flipped_is_refused() {
    let d = Drive::start();
    let content = pattern(0xc0de, 4 * BLOCK as usize);
    let object = d.create_object(P2, &content);
    let before = usage(&d);
    let region = flip_region();
    let new_data = pattern(0xbad, region.length as usize);
    let chunks = new_data.len().div_ceil(CHUNK as usize);
    for (label, bits) in [("INTEGRITY_DATA", IA | ID), ("INTEGRITY_DATA+HASH_AND_MAC", IA | ID | HM)] {
        let mut args = d.cap_args(P2, object, rights::WRITE);
        args.min_protection = prot(bits);
        let cred = d.mint(&args, false).client();
        // The request's length, from the same write to another object.
        let other = d.create_object(P2, &[]);
        let mut other_args = d.cap_args(P2, other, rights::WRITE);
        other_args.min_protection = prot(bits);
        let other_cred = d.mint(&other_args, false).client();
        let proxy = Proxy::start(d.addr());
        let (addr, data) = (proxy.addr, new_data.clone());
        d.rt.block_on(async move {
            let mut c = client_as(addr, other_cred, bits).await.expect("connect");
            c.set_chunk_len(CHUNK);
            to(c.write(P2, other, &[region], &data)).await.expect("untampered write");
        });
        d.ok(&d.dk(), IA, &Request::Remove { partition: P2, object: other });
        let (up, _) = proxy.captured();
        let lengths = reply_frame_lengths(&up);
        let len = lengths[1];
        let data_at = len - new_data.len() - chunks * 32;
        let per_worker = (len - data_at).div_ceil(FLIP_WORKERS);
        let tally = flip_in_parallel(d.addr(), 0..FLIP_WORKERS, |proxy, rt, w| {
            let first_offset = data_at + w;
            let count = (len - first_offset).div_ceil(FLIP_WORKERS);
            assert!(count <= per_worker);
            proxy.set(Some(Tamper::XorRequests { first_frame: 1, first_offset, stride: FLIP_WORKERS, mask: 0x10 }));
            let (addr, cred, data) = (proxy.addr, cred.clone(), new_data.clone());
            rt.block_on(async move {
                let mut c = client_as(addr, cred, bits).await.expect("connect");
                c.set_chunk_len(CHUNK);
                for i in 0..count {
                    match to(c.write(P2, object, &[region], &data)).await {
                        Err(ClientError::Status { status: Status::BadDataTag, .. }) => {}
                        other => panic!("{label}: write byte {} flipped: {other:?}", first_offset + i * FLIP_WORKERS),
                    }
                }
            });
            format!("{count} writes refused with BAD_DATA_TAG")
        });
        assert!(content_of(&d, object) == content, "{label}: a refused write changed the object");
        assert_eq!(usage(&d), before, "{label}: refused writes leaked blocks");
        eprintln!("{label} write: {} data and tag bytes flipped: {tally:?}", len - data_at);
        d.cases.borrow_mut().push(format!(
            "{label} write request: each of its {} data and tag bytes flipped ({chunks} chunks; all refused, nothing changed)",
            len - data_at
        ));
    }

    // A long write (a partial block, six whole ones and a partial one: 49
    // chunks of 512 bytes) whose last chunk is tampered. The drive hands each
    // verified chunk to the store at once and buffers at most
    // TRANSFER_CHUNKS_MAX of them, so when the last chunk fails the store has
    // taken chunks 0..=43 and stored logical blocks 0..=5 in new blocks:
    // the abort must release them all.
    let long = rg(BLOCK as u64 - 150, 150 + 6 * BLOCK as u64 + 100);
    let mut big = content.clone();
    big.resize(8 * BLOCK as usize, 0x77);
    let req = Request::Write { partition: P2, object, regions: vec![rg(0, big.len() as u64)] };
    d.ok_data(&d.dk(), IA | ID, &req, &big);
    let before = usage(&d);
    let data = pattern(0x1a7e, long.length as usize);
    let mut args = d.cap_args(P2, object, rights::WRITE);
    args.min_protection = prot(IA | ID | HM);
    let cred = d.mint(&args, false).client();
    let proxy = Proxy::start(d.addr());
    let chunks = data.len().div_ceil(CHUNK as usize);
    let write_args = Request::Write { partition: P2, object, regions: vec![long] }.encode_args().len();
    let data_at = HEADER_LEN + CAPABILITY_ARGS_LEN + write_args + DIGEST_LEN;
    let last_data_byte = data_at + data.len() + (chunks - 1) * 32 - 1;
    proxy.set(Some(Tamper::XorRequest { frame: 1, offset: last_data_byte, mask: 0x01 }));
    let (addr, sent) = (proxy.addr, data.clone());
    let r = d.rt.block_on(async move {
        let mut c = client_as(addr, cred, IA | ID | HM).await.expect("connect");
        c.set_chunk_len(CHUNK);
        to(c.write(P2, object, &[long], &sent)).await
    });
    assert!(matches!(r, Err(ClientError::Status { status: Status::BadDataTag, .. })), "{r:?}");
    let (up, _) = proxy.captured();
    assert_eq!(reply_frame_lengths(&up)[1], last_data_byte + 1 + 32, "the flip hit the last data byte");
    let surely_taken = (chunks - 1 - nasd_drive::TRANSFER_CHUNKS_MAX) * CHUNK as usize;
    assert!(surely_taken > 150 + 5 * BLOCK as usize, "blocks 0..=5 were stored before the failing chunk");
    assert!(content_of(&d, object) == big, "a write refused in its last chunk left bytes behind");
    assert_eq!(usage(&d), before, "a write refused in its last chunk leaked blocks");
    d.cases.borrow_mut().push(format!(
        "write of {chunks} chunks tampered in its last chunk after blocks were stored (refused, nothing visible, no block leaked)"
    ));
    d.verify("write data byte flips");
    d.finish("write data byte flips");
}
