//! Known-answer vectors for nasd security (docs/PROTOCOL.md, "Security
//! known-answer vectors"). Every vector is computed from fixed inputs and
//! compared with hex pasted into this file and into PROTOCOL.md, and each is
//! also recomputed independently from the documented construction with the
//! primitive crates (blake3, hmac, chacha20, chacha20poly1305) directly, so
//! the document, `nasd-crypto` and `nasd-proto` cannot drift apart silently.
//!
//! Inputs (all fixed):
//! - working key W = 32 × 0x11 (partition 7, version 1), master key
//!   M = 32 × 0x22, new drive key D = 32 × 0x33;
//! - capability arguments [`args`]; request nonces (1 000 000 000 ns,
//!   sequence = request id); the reply's drive nonce (1 000 000 500 ns, 77);
//! - seal nonces 24 × 0x44 (capability) and 24 × 0x55 (drive key).
//!
//! - manager key 32 × 0x66 and file system id 16 × 0x77 (file handle).
//!
//! - identity key K = 32 × 0x88 (key id 2), credential [`identity`], drive
//!   00..0f (the capability's) for the drive-bound keys; seal nonce 24 × 0x99
//!   (identity key).
//!
//! Vectors (a)–(g) are PROTOCOL.md's S1–S7; (h) is S8; (i)–(l) are S9–S12,
//! and `dsfs_vectors_are_published_in_protocol_md` checks those are in
//! PROTOCOL.md byte for byte.

use chacha20::cipher::{KeyIvInit, StreamCipher};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use hmac::Mac as _;
use nasd_crypto::{
    capability_key, identity_drive_key, identity_key, identity_login_proof, key_context, open_key, seal_with_nonce,
    unseal_capability, FileHandleKey, FrameKeys, Key, MacAlgorithm,
};
use nasd_proto::{
    nonce, opcode, rights, CapabilityArgs, FrameHeader, FramePrefix, IdentityData, KeyType, Kind, Protection, Region,
    Request, SealedCapabilityPrefix, SEALED_CAPABILITY_LEN,
};

const WORKING: [u8; 32] = [0x11; 32];
const MASTER: [u8; 32] = [0x22; 32];
const NEW_DRIVE_KEY: [u8; 32] = [0x33; 32];
const CAPABILITY_SEAL_NONCE: [u8; 24] = [0x44; 24];
const KEY_SEAL_NONCE: [u8; 24] = [0x55; 24];
const DRIVE_ID: [u8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
const NONCE_TIME_NS: u64 = 1_000_000_000;

/// The capability every vector uses: BLAKE3 (`algorithm` 1) or HMAC-SHA-256 (2),
/// minimum protection INTEGRITY_ARGS, working key version 1, drive 00..0f,
/// partition 7, object 16, region (0, 4096), ACV 1, rights READ|WRITE|GETATTR,
/// expiration 2·10^18 ns, audit id 42.
fn args(algorithm: u8) -> CapabilityArgs {
    CapabilityArgs {
        algorithm,
        min_protection: Protection::INTEGRITY_ARGS,
        key_version: 1,
        drive_id: DRIVE_ID,
        partition: 7,
        object: 16,
        region: Region { offset: 0, length: 4096 },
        access_control_version: 1,
        rights: rights::READ | rights::WRITE | rights::GETATTR,
        map_epoch: 0,
        expiration_ns: 2_000_000_000_000_000_000,
        audit_id: 42,
    }
}

fn working() -> Key {
    Key::from_bytes(WORKING)
}

fn h(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// Compares `got` with the expected hex (`want` may be split into lines with `concat!`).
fn check(name: &str, got: &[u8], want: &str) {
    assert_eq!(h(got), want, "vector {name}");
}

/// Independent BLAKE3 key derivation (what `Key::derive` must be).
fn derive(purpose: &str, key: &[u8; 32]) -> [u8; 32] {
    blake3::derive_key(purpose, key)
}

/// Independent keyed BLAKE3 of the concatenation of `parts`.
fn keyed_blake3(key: &[u8; 32], parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new_keyed(key);
    for p in parts {
        hasher.update(p);
    }
    *hasher.finalize().as_bytes()
}

/// Independent XChaCha20 of `data` (stream offset 0).
fn xchacha20(key: &[u8; 32], nonce: &[u8; 24], data: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    chacha20::XChaCha20::new(key.into(), nonce.into()).apply_keystream(&mut out);
    out
}

/// Independent XChaCha20-Poly1305 seal: nonce ‖ ciphertext ‖ tag.
fn aead_seal(key: &[u8; 32], nonce: &[u8; 24], aad: &[u8], msg: &[u8]) -> Vec<u8> {
    let ct = chacha20poly1305::XChaCha20Poly1305::new(key.into()).encrypt(nonce.into(), Payload { msg, aad }).unwrap();
    [nonce.as_slice(), &ct].concat()
}

/// The 24-byte keystream nonce of PROTOCOL.md: frame nonce ‖ kind ‖ section ‖ 6 zero bytes.
fn stream_nonce(frame_nonce: &[u8; 16], kind: u8, section: u8) -> [u8; 24] {
    let mut n = [0u8; 24];
    n[..16].copy_from_slice(frame_nonce);
    n[16] = kind;
    n[17] = section;
    n
}

/// A request header protected by the capability key.
fn capability_request(op: u16, request_id: u64, protection: Protection) -> FrameHeader {
    let mut hd = FrameHeader::request(op, request_id);
    hd.key_type = KeyType::Capability;
    hd.protection = protection;
    hd.nonce = nonce(NONCE_TIME_NS, request_id);
    hd
}

/// Encodes a frame prefix with `digest` computed by `keys` (args already in wire form).
fn protected_prefix(keys: &FrameKeys, hd: &FrameHeader, capability: &[u8], wire_args: &[u8]) -> (Vec<u8>, [u8; 32]) {
    let mut bytes = FramePrefix::encode(hd, capability, wire_args, &[0; 32]);
    let split = bytes.len() - 32;
    let digest = keys.digest(hd.protection, &bytes[..split]);
    bytes[split..].copy_from_slice(&digest);
    (bytes, digest)
}

// ------------------------------------------------------------------ vectors

const CLEAR_TOKEN: &str = concat!(
    "0101010001000000000102030405060708090a0b0c0d0e0f0700000000000000",
    "1000000000000000000000000000000000100000000000000100000000000000",
    "0b000000000000000000c84e676dc11b2a00000000000000",
);

/// [`CLEAR_TOKEN`] with `map_epoch` 3.
const CLEAR_TOKEN_EPOCH3: &str = concat!(
    "0101010001000000000102030405060708090a0b0c0d0e0f0700000000000000",
    "1000000000000000000000000000000000100000000000000100000000000000",
    "0b000000030000000000c84e676dc11b2a00000000000000",
);

#[test]
fn a_capability_keys() {
    let w = working();
    check("A_TOKEN", &args(1).encode(), CLEAR_TOKEN);

    let blake = capability_key(&w, &args(1)).unwrap();
    check("A1", blake.expose(), "7abad3f5efa7c28c50a0f252610e6a0a4803becea2d784937bb11331e0166581");
    assert_eq!(*blake.expose(), keyed_blake3(&WORKING, &[&args(1).encode()]));

    let hmac = capability_key(&w, &args(2)).unwrap();
    check("A2", hmac.expose(), "3e8aaf3a7b5105f2d97ea9832967373f49bf3fa50d49e0e69f1347abcfc88dff");
    let mut m = <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(&WORKING).unwrap();
    m.update(&args(2).encode());
    assert_eq!(hmac.expose().as_slice(), m.finalize().into_bytes().as_slice());

    assert!(capability_key(&w, &CapabilityArgs { algorithm: 3, ..args(1) }).is_none());

    // The same capability minted under cluster map epoch 3 (bytes 68–71).
    let epoch3 = CapabilityArgs { map_epoch: 3, ..args(1) };
    check("A_TOKEN_EPOCH3", &epoch3.encode(), CLEAR_TOKEN_EPOCH3);
    let key3 = capability_key(&w, &epoch3).unwrap();
    check("A3", key3.expose(), "36eb7f647e32033181e3f796cafb62a63c83b44907e1b92cde578f6ff96d826f");
    assert_eq!(*key3.expose(), keyed_blake3(&WORKING, &[&epoch3.encode()]));
}

#[test]
fn b_integrity_args_getattr() {
    let cap_key = capability_key(&working(), &args(1)).unwrap();
    let keys = FrameKeys::new(MacAlgorithm::Blake3, &cap_key);
    let hd = capability_request(opcode::GETATTR, 1, Protection::INTEGRITY_ARGS);
    let token = args(1).encode();
    let req = Request::GetAttr { partition: 7, object: 16 };
    let (frame, digest) = protected_prefix(&keys, &hd, &token, &req.encode_args());

    check("B_DIGEST", &digest, "45990cd214902844238a3309565d53a2394bc024c71e0006a8e631f5e0cdfeb6");
    check(
        "B_FRAME",
        &frame,
        concat!(
            "4e41534401010301010000000000000005010000580000001000000000000000",
            "000000000000000000ca9a3b0000000001000000000000000101010001000000",
            "000102030405060708090a0b0c0d0e0f07000000000000001000000000000000",
            "0000000000000000001000000000000001000000000000000b00000000000000",
            "0000c84e676dc11b2a0000000000000007000000000000001000000000000000",
            "45990cd214902844238a3309565d53a2394bc024c71e0006a8e631f5e0cdfeb6",
        ),
    );

    // The digest is keyed BLAKE3 under derive_key("nasd v1 frame mac", K) of every byte before it.
    let mac_key = derive("nasd v1 frame mac", cap_key.expose());
    assert_eq!(digest, keyed_blake3(&mac_key, &[&frame[..frame.len() - 32]]));
    let parsed = FramePrefix::parse(&frame).unwrap();
    assert!(keys.verify_digest(parsed.header.protection, &frame[..frame.len() - 32], &parsed.digest));
    assert_eq!(Request::decode(parsed.header.opcode, parsed.args).unwrap(), req);
}

#[test]
fn c_privacy_args_getattr() {
    let cap_key = capability_key(&working(), &args(1)).unwrap();
    let keys = FrameKeys::new(MacAlgorithm::Blake3, &cap_key);
    let protection = Protection::INTEGRITY_ARGS.union(Protection::PRIVACY_ARGS);
    let hd = capability_request(opcode::GETATTR, 2, protection);
    let token = args(1).encode();
    let req = Request::GetAttr { partition: 7, object: 16 };
    let mut wire_args = req.encode_args();
    keys.crypt_args(Kind::Request, &hd.nonce, &mut wire_args);
    let (frame, digest) = protected_prefix(&keys, &hd, &token, &wire_args);

    check("C_ARGS", &wire_args, "926603c0d2ef29b042efd86c976c75b0");
    check("C_DIGEST", &digest, "46315aa752a6fe67dc9dc88270e92c1a5c8288e3bff41eb49f490e259eebfd81");
    check(
        "C_FRAME",
        &frame,
        concat!(
            "4e41534401010301020000000000000005050000580000001000000000000000",
            "000000000000000000ca9a3b0000000002000000000000000101010001000000",
            "000102030405060708090a0b0c0d0e0f07000000000000001000000000000000",
            "0000000000000000001000000000000001000000000000000b00000000000000",
            "0000c84e676dc11b2a00000000000000926603c0d2ef29b042efd86c976c75b0",
            "46315aa752a6fe67dc9dc88270e92c1a5c8288e3bff41eb49f490e259eebfd81",
        ),
    );

    // Arguments: XChaCha20 under derive_key("nasd v1 frame encryption", K), nonce = frame nonce ‖ 01 ‖ 01 ‖ 0^6.
    let enc_key = derive("nasd v1 frame encryption", cap_key.expose());
    assert_eq!(wire_args, xchacha20(&enc_key, &stream_nonce(&hd.nonce, 1, 1), &req.encode_args()));
    // Encrypt, then MAC: the digest covers the ciphertext.
    let mac_key = derive("nasd v1 frame mac", cap_key.expose());
    assert_eq!(digest, keyed_blake3(&mac_key, &[&frame[..frame.len() - 32]]));
    // The receiver decrypts with the same call.
    let mut back = wire_args.clone();
    keys.crypt_args(Kind::Request, &hd.nonce, &mut back);
    assert_eq!(back, req.encode_args());
}

#[test]
fn d_integrity_data_write_tags() {
    let cap_key = capability_key(&working(), &args(1)).unwrap();
    let keys = FrameKeys::new(MacAlgorithm::Blake3, &cap_key);
    let protection = Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA);
    let mut hd = capability_request(opcode::WRITE, 3, protection);
    hd.data_len = 1024;
    hd.chunk_len = 512;
    let token = args(1).encode();
    let req = Request::Write { partition: 7, object: 16, regions: vec![Region { offset: 0, length: 1024 }] };
    let (frame, digest) = protected_prefix(&keys, &hd, &token, &req.encode_args());
    let data: Vec<u8> = (0..1024u32).map(|i| (i % 251) as u8).collect();
    let (one, two) = data.split_at(512);

    let mut sender = keys.data(Kind::Request, &hd.nonce, protection, &digest);
    let mut c1 = one.to_vec();
    let tag1 = sender.seal_chunk(&mut c1);
    let mut c2 = two.to_vec();
    let tag2 = sender.seal_chunk(&mut c2);
    assert_eq!((c1.as_slice(), c2.as_slice()), (one, two), "INTEGRITY_DATA alone does not encrypt");

    check("D_DIGEST", &digest, "62a99f393b5af19f38be95e4cb62963ca31cf0bfa026a77f257db23d42cc5e7e");
    check(
        "D_FRAME",
        &frame,
        concat!(
            "4e41534401010601030000000000000005030000580000002200000000020000",
            "000400000000000000ca9a3b0000000003000000000000000101010001000000",
            "000102030405060708090a0b0c0d0e0f07000000000000001000000000000000",
            "0000000000000000001000000000000001000000000000000b00000000000000",
            "0000c84e676dc11b2a0000000000000007000000000000001000000000000000",
            "01000000000000000000000400000000000062a99f393b5af19f38be95e4cb62",
            "963ca31cf0bfa026a77f257db23d42cc5e7e",
        ),
    );
    check("D_TAG1", &tag1, "b8cfc0171ed24add713bebefbcb6092f84444cb4db0af6f636cffb9630eff59c");
    check("D_TAG2", &tag2, "b9d32d923a58a1d8c12f8ed0bcbec3753ca3d0bc876681b7e49dc46026c226f5");

    // Tag i = MAC(mac key, frame digest ‖ chunk 1 ‖ … ‖ chunk i).
    let mac_key = derive("nasd v1 frame mac", cap_key.expose());
    assert_eq!(tag1, keyed_blake3(&mac_key, &[&digest, one]));
    assert_eq!(tag2, keyed_blake3(&mac_key, &[&digest, one, two]));
    let mut receiver = keys.data(Kind::Request, &hd.nonce, protection, &digest);
    assert!(receiver.open_chunk(&mut c1, &tag1).is_ok());
    assert!(receiver.open_chunk(&mut c2, &tag2).is_ok());
    // Tags are cumulative: the first tag does not vouch for the second chunk.
    let mut reorder = keys.data(Kind::Request, &hd.nonce, protection, &digest);
    assert!(reorder.open_chunk(&mut two.to_vec(), &tag1).is_err());
}

#[test]
fn e_sealed_capability() {
    let w = working();
    let a = args(1);
    let prefix = SealedCapabilityPrefix { key_version: 1, partition: 7 }.encode();
    let seal_key = w.derive("nasd v1 capability seal");
    assert_eq!(*seal_key.expose(), derive("nasd v1 capability seal", &WORKING));
    let token = [prefix.as_slice(), &seal_with_nonce(&seal_key, &CAPABILITY_SEAL_NONCE, &prefix, &a.encode())].concat();

    assert_eq!(token.len(), SEALED_CAPABILITY_LEN);
    assert_eq!(h(&prefix), "02000000010000000700000000000000");
    check(
        "E_TOKEN",
        &token,
        concat!(
            "0200000001000000070000000000000044444444444444444444444444444444",
            "4444444444444444b6692e311b2a727d8388c14ab9a220d58abff49196839191",
            "9e34105986dc1a0eae4a9e265d14f31fdf3767ae6eab3dc3b8ce5def1d82b8f8",
            "1335e3177451a4253dca2d6cc1c1804b1ac246269dd3b8819fb474df3078fa6b",
            "4415d099d64f5d518322b42b96b19d56",
        ),
    );
    assert_eq!(token[16..], aead_seal(seal_key.expose(), &CAPABILITY_SEAL_NONCE, &prefix, &a.encode()));

    // The drive's opener accepts exactly this layout: the documentation matches the code.
    assert_eq!(unseal_capability(&w, &token), Some(a.clone()));
    assert_eq!(unseal_capability(&Key::from_bytes([0x12; 32]), &token), None);
    let mut moved = token.clone();
    moved[8] = 8; // the prefix is associated data: naming another partition fails
    assert_eq!(unseal_capability(&w, &moved), None);
}

#[test]
fn f_sealed_drive_key() {
    let master = Key::from_bytes(MASTER);
    let context = key_context(opcode::SET_DRIVE_KEY, 0, 0);
    // "nasd v1 key " ‖ opcode 0x0302 ‖ partition 0 ‖ version 0, little-endian.
    check("F_CONTEXT", &context, "6e617364207631206b6579200203000000000000000000000000");
    let sealed = seal_with_nonce(&master, &KEY_SEAL_NONCE, &context, &NEW_DRIVE_KEY);

    assert_eq!(sealed.len(), nasd_crypto::SEALED_KEY_LEN);
    check(
        "F_SEALED",
        &sealed,
        concat!(
            "555555555555555555555555555555555555555555555555071efc7f7f1fdecc",
            "749267cf17aad4b8779666ddf9d405792e30ad17e9e0d4b2f1833a830599a38d",
            "84ecf310cd3c3471",
        ),
    );
    assert_eq!(sealed, aead_seal(&MASTER, &KEY_SEAL_NONCE, &context, &NEW_DRIVE_KEY));
    assert_eq!(open_key(&master, &context, &sealed).unwrap(), Key::from_bytes(NEW_DRIVE_KEY));
    assert!(open_key(&master, &key_context(opcode::SET_PARTITION_KEY, 0, 0), &sealed).is_err());

    // The whole SETDRIVEKEY request under the master key (key-hierarchy keys MAC with BLAKE3).
    let req = Request::SetDriveKey { sealed_key: sealed.clone() };
    let mut hd = FrameHeader::request(opcode::SET_DRIVE_KEY, 4);
    hd.key_type = KeyType::Master;
    hd.protection = Protection::INTEGRITY_ARGS;
    hd.nonce = nonce(NONCE_TIME_NS, 4);
    let keys = FrameKeys::new(MacAlgorithm::Blake3, &master);
    let (frame, digest) = protected_prefix(&keys, &hd, &[], &req.encode_args());
    check("F_DIGEST", &digest, "73e61e4300ec58cc0ae5641335c4132bd92152e5f6e43a31cd27d43aed3ad92a");
    check(
        "F_FRAME",
        &frame,
        concat!(
            "4e41534401010203040000000000000001010000000000004a00000000000000",
            "000000000000000000ca9a3b0000000004000000000000004800555555555555",
            "555555555555555555555555555555555555071efc7f7f1fdecc749267cf17aa",
            "d4b8779666ddf9d405792e30ad17e9e0d4b2f1833a830599a38d84ecf310cd3c",
            "347173e61e4300ec58cc0ae5641335c4132bd92152e5f6e43a31cd27d43aed3a",
            "d92a",
        ),
    );
    assert_eq!(digest, keyed_blake3(&derive("nasd v1 frame mac", &MASTER), &[&frame[..frame.len() - 32]]));
}

#[test]
fn g_protected_reply() {
    // The drive's failed reply to the request of vector (c): NO_SUCH_OBJECT,
    // protection INTEGRITY_ARGS | PRIVACY_ARGS, drive nonce (1 000 000 500 ns, 77).
    let cap_key = capability_key(&working(), &args(1)).unwrap();
    let keys = FrameKeys::new(MacAlgorithm::Blake3, &cap_key);
    let protection = Protection::INTEGRITY_ARGS.union(Protection::PRIVACY_ARGS);
    let request = capability_request(opcode::GETATTR, 2, protection);
    let request_digest = {
        let mut a = Request::GetAttr { partition: 7, object: 16 }.encode_args();
        keys.crypt_args(Kind::Request, &request.nonce, &mut a);
        protected_prefix(&keys, &request, &args(1).encode(), &a).1
    };
    let mut hd = FrameHeader::reply_to(&request, nasd_proto::Status::NoSuchObject);
    hd.nonce = nonce(1_000_000_500, 77);
    let plain = nasd_proto::encode_error_message("no such object 16 in partition 7");
    let mut wire_args = plain.clone();
    keys.crypt_args(Kind::Reply, &hd.nonce, &mut wire_args);
    let mut frame = FramePrefix::encode(&hd, &[], &wire_args, &[0; 32]);
    let split = frame.len() - 32;
    let digest = keys.reply_digest(protection, &request_digest, &frame[..split]);
    frame[split..].copy_from_slice(&digest);

    check("G_DIGEST", &digest, "4987ec4d26a3492d445ff28761e797afedfbdb6c18b0f56bb0217ae9b482f6d3");
    check(
        "G_FRAME",
        &frame,
        concat!(
            "4e41534401020301020000000000000005050a00000000002200000000000000",
            "0000000000000000f4cb9a3b000000004d000000000000001eab52e8e5aca592",
            "7beb2cb0196d03127ef3b732f51652722e22060cc065e7205a464987ec4d26a3",
            "492d445ff28761e797afedfbdb6c18b0f56bb0217ae9b482f6d3",
        ),
    );

    // Reply arguments: keystream nonce with kind 2; digest = MAC(mac key, request digest ‖ reply before its digest).
    let enc_key = derive("nasd v1 frame encryption", cap_key.expose());
    assert_eq!(wire_args, xchacha20(&enc_key, &stream_nonce(&hd.nonce, 2, 1), &plain));
    let mac_key = derive("nasd v1 frame mac", cap_key.expose());
    assert_eq!(digest, keyed_blake3(&mac_key, &[&request_digest, &frame[..split]]));
    assert!(keys.verify_reply_digest(protection, &request_digest, &frame[..split], &digest));
    // Bound to its request: the same reply does not verify as the answer to another request.
    assert!(!keys.verify_reply_digest(protection, &[0u8; 32], &frame[..split], &digest));
    // Without INTEGRITY_ARGS a reply's digest is zero: it never echoes the key.
    assert_eq!(keys.reply_digest(Protection::NONE, &request_digest, &frame[..split]), [0u8; 32]);
}

#[test]
fn h_file_handle() {
    // The manager's handle for inode 42 given to uid 1000, under manager key 32 × 0x66 and file
    // system id 16 × 0x77.
    const MANAGER_KEY: [u8; 32] = [0x66; 32];
    const FS_ID: [u8; 16] = [0x77; 16];
    let handles = FileHandleKey::new(&Key::from_bytes(MANAGER_KEY), FS_ID);
    let tag = handles.mac(1000, 42);
    let handle = nasd_proto::manager::Handle { ino: 42, site: 0, mac: tag };
    let mut w = nasd_proto::codec::Writer::with_capacity(41);
    handle.encode(&mut w);
    let bytes = w.into_vec();

    check("H_MAC", &tag, "67992134fbaab148c0fc2cefe3f87746280640f127dec1dc3eb4013a10ce7d24");
    check(
        "H_HANDLE",
        &bytes,
        concat!("2a00000000000000", "00", "67992134fbaab148c0fc2cefe3f87746280640f127dec1dc3eb4013a10ce7d24"),
    );

    // key = derive_key("nasd v1 manager file handle key", manager key);
    // MAC = keyed BLAKE3(key, "nasd v1 file handle" ‖ fs id ‖ uid u32 LE ‖ ino u64 LE).
    let key = derive("nasd v1 manager file handle key", &MANAGER_KEY);
    let want = keyed_blake3(&key, &[b"nasd v1 file handle", &FS_ID, &1000u32.to_le_bytes(), &42u64.to_le_bytes()]);
    assert_eq!(tag, want);
    assert!(handles.verify(1000, 42, &tag));
    assert!(!handles.verify(1001, 42, &tag), "bound to the user");
    assert!(!handles.verify(1000, 43, &tag), "bound to the inode");
}

// ------------------------------------------------------------ DSFS vectors

const IDENTITY_KEY: [u8; 32] = [0x88; 32];
const IDENTITY_SEAL_NONCE: [u8; 24] = [0x99; 24];

/// The identity credential every DSFS vector uses: algorithm 1 (BLAKE3; 2
/// for HMAC-SHA-256), identity key id 2, user 1000, role 7, expiration
/// 2·10^18 ns.
fn identity(algorithm: u8) -> IdentityData {
    IdentityData { algorithm, key_id: 2, user: 1000, role: 7, expiration_ns: 2_000_000_000_000_000_000 }
}

/// Every hex vector of PROTOCOL.md: the code blocks' lines, joined.
fn published_blocks() -> Vec<String> {
    let doc = include_str!("../../../docs/PROTOCOL.md");
    let mut published = Vec::new();
    let mut block: Option<String> = None;
    for line in doc.lines() {
        match (&mut block, line.trim()) {
            (None, "```") => block = Some(String::new()),
            (Some(b), "```") => {
                published.push(std::mem::take(b));
                block = None;
            }
            (Some(b), l) => b.push_str(l),
            (None, _) => {}
        }
    }
    published
}

const I_CREDENTIAL: &str = "0301000002000000e8030000070000000000c84e676dc11b";
const I_IDKEY_BLAKE3: &str = "cc41fb670cb19221111f716d092abf7c2c9f5a7005ab2ee93e820150fa20d520";
const I_IDKEY_HMAC: &str = "ed6e4552258cfb56573fc3ebce8f47d3261828da8874c43b16d9097742d78a2e";
const I_DRIVEKEY_BLAKE3: &str = "bee3303e3a57762a5291161226999a76a5826e71c09460f615a783f2bb5d8586";
const I_DRIVEKEY_HMAC: &str = "23ce82c0a7bf466abe8a40c20ea195f4db0394ffae9bbaec5c97c9a93cafe00f";
const J_DIGEST: &str = "9c0f8e047e13c15170694b7153ada4d24f2ee6882f01a0754d39e6de7f715a63";
const J_FRAME: &str = concat!(
    "4e41534401010301050000000000000006010000180000001000000000000000",
    "000000000000000000ca9a3b0000000005000000000000000301000002000000",
    "e8030000070000000000c84e676dc11b07000000000000001000000000000000",
    "9c0f8e047e13c15170694b7153ada4d24f2ee6882f01a0754d39e6de7f715a63",
);
const K_CONTEXT: &str = "6e617364207631206b6579200603000000000000000002000000";
const K_SEALED: &str = concat!(
    "999999999999999999999999999999999999999999999999fb7f6d68f3e15959",
    "ff81a12098c9d0028a653abddccb70b9dabad9619163ea118f728d0092d86da3",
    "8ad99385acb11715",
);

#[test]
fn i_identity_credential_and_identity_keys() {
    let k = Key::from_bytes(IDENTITY_KEY);
    check("I_CREDENTIAL", &identity(1).encode(), I_CREDENTIAL);
    let blake = identity_key(&k, &identity(1)).unwrap();
    check("I_IDKEY_BLAKE3", blake.expose(), I_IDKEY_BLAKE3);
    // idkey = keyed BLAKE3 (K, the 24 credential bytes).
    assert_eq!(*blake.expose(), keyed_blake3(&IDENTITY_KEY, &[&identity(1).encode()]));
    let hmac = identity_key(&k, &identity(2)).unwrap();
    check("I_IDKEY_HMAC", hmac.expose(), I_IDKEY_HMAC);
    let mut m = <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(&IDENTITY_KEY).unwrap();
    m.update(&identity(2).encode());
    assert_eq!(hmac.expose().as_slice(), m.finalize().into_bytes().as_slice());
    // Every field is bound: changing any one changes the identity key.
    for other in [
        IdentityData { user: 1001, ..identity(1) },
        IdentityData { role: 8, ..identity(1) },
        IdentityData { key_id: 3, ..identity(1) },
        IdentityData { expiration_ns: identity(1).expiration_ns + 1, ..identity(1) },
    ] {
        assert_ne!(identity_key(&k, &other).unwrap(), blake, "{other:?}");
    }
    assert!(identity_key(&k, &IdentityData { algorithm: 3, ..identity(1) }).is_none());
}

/// S9, continued: the key an identity's requests to drive 00..0f are MACed
/// with, `MAC_alg(idkey, "nasd v1 identity drive " ‖ drive_id)`.
#[test]
fn i_identity_drive_keys() {
    let k = Key::from_bytes(IDENTITY_KEY);
    let blake = identity_key(&k, &identity(1)).unwrap();
    let bound = identity_drive_key(&blake, &identity(1), &DRIVE_ID).unwrap();
    check("I_DRIVEKEY_BLAKE3", bound.expose(), I_DRIVEKEY_BLAKE3);
    assert_eq!(*bound.expose(), keyed_blake3(blake.expose(), &[b"nasd v1 identity drive ", &DRIVE_ID]));
    let hmac = identity_key(&k, &identity(2)).unwrap();
    let bound_hmac = identity_drive_key(&hmac, &identity(2), &DRIVE_ID).unwrap();
    check("I_DRIVEKEY_HMAC", bound_hmac.expose(), I_DRIVEKEY_HMAC);
    let mut m = <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(hmac.expose()).unwrap();
    m.update(b"nasd v1 identity drive ");
    m.update(&DRIVE_ID);
    assert_eq!(bound_hmac.expose().as_slice(), m.finalize().into_bytes().as_slice());
    // Another drive, another key: no drive can check a request MACed for another.
    let mut other = DRIVE_ID;
    other[15] ^= 1;
    assert_ne!(identity_drive_key(&blake, &identity(1), &other).unwrap(), bound);
    assert_ne!(bound, blake, "the drive key is not the identity key");
}

#[test]
fn j_getattr_under_an_identity() {
    let idkey = identity_key(&Key::from_bytes(IDENTITY_KEY), &identity(1)).unwrap();
    let bound = identity_drive_key(&idkey, &identity(1), &DRIVE_ID).unwrap();
    let keys = FrameKeys::new(MacAlgorithm::Blake3, &bound);
    let mut hd = FrameHeader::request(opcode::GETATTR, 5);
    hd.key_type = KeyType::Identity;
    hd.protection = Protection::INTEGRITY_ARGS;
    hd.nonce = nonce(NONCE_TIME_NS, 5);
    let req = Request::GetAttr { partition: 7, object: 16 };
    let (frame, digest) = protected_prefix(&keys, &hd, &identity(1).encode(), &req.encode_args());
    check("J_DIGEST", &digest, J_DIGEST);
    check("J_FRAME", &frame, J_FRAME);
    assert_eq!(frame.len(), 56 + 24 + 16 + 32);
    assert_eq!(frame[16], 6, "key type IDENTITY");
    // The same construction as a capability's: digest = keyed BLAKE3 under
    // derive_key("nasd v1 frame mac", K) of every byte before it, with K the
    // identity key bound to the drive.
    let mac_key = derive("nasd v1 frame mac", bound.expose());
    assert_ne!(digest, keyed_blake3(&derive("nasd v1 frame mac", idkey.expose()), &[&frame[..frame.len() - 32]]));
    assert_eq!(digest, keyed_blake3(&mac_key, &[&frame[..frame.len() - 32]]));
    let parsed = FramePrefix::parse(&frame).unwrap();
    assert_eq!(IdentityData::decode(parsed.capability).unwrap(), identity(1));
}

#[test]
fn k_sealed_identity_key() {
    let drive = Key::from_bytes(NEW_DRIVE_KEY);
    let context = key_context(opcode::SET_IDENTITY_KEY, 0, 2);
    check("K_CONTEXT", &context, K_CONTEXT);
    let sealed = seal_with_nonce(&drive, &IDENTITY_SEAL_NONCE, &context, &IDENTITY_KEY);
    check("K_SEALED", &sealed, K_SEALED);
    assert_eq!(sealed, aead_seal(&NEW_DRIVE_KEY, &IDENTITY_SEAL_NONCE, &context, &IDENTITY_KEY));
    assert_eq!(open_key(&drive, &context, &sealed).unwrap(), Key::from_bytes(IDENTITY_KEY));
    // Bound to its slot: it does not open as the key of another id.
    assert!(open_key(&drive, &key_context(opcode::SET_IDENTITY_KEY, 0, 3), &sealed).is_err());
}

const L_PROOF: &str = "8656397b33ba1913eeb4b63fa1d1f7262527479d287841747cd7e549be1a55e8";

/// S12: the proof a client gives the manager with `LOGIN_IDENTITY`.
#[test]
fn l_identity_login_proof() {
    let idkey = identity_key(&Key::from_bytes(IDENTITY_KEY), &identity(1)).unwrap();
    let proof = identity_login_proof(&idkey, &identity(1)).unwrap();
    check("L_PROOF", &proof, L_PROOF);
    // keyed BLAKE3 under derive_key("nasd v1 manager identity login", idkey) of the credential.
    let k = derive("nasd v1 manager identity login", idkey.expose());
    assert_eq!(proof, keyed_blake3(&k, &[&identity(1).encode()]));
    assert_ne!(&proof, idkey.expose(), "the proof is not the identity key");
}

/// S9–S11 are in PROTOCOL.md exactly as computed here.
#[test]
fn dsfs_vectors_are_published_in_protocol_md() {
    let published = published_blocks();
    for (name, hex) in [
        ("I_CREDENTIAL", I_CREDENTIAL),
        ("I_IDKEY_BLAKE3", I_IDKEY_BLAKE3),
        ("I_IDKEY_HMAC", I_IDKEY_HMAC),
        ("I_DRIVEKEY_BLAKE3", I_DRIVEKEY_BLAKE3),
        ("I_DRIVEKEY_HMAC", I_DRIVEKEY_HMAC),
        ("J_DIGEST", J_DIGEST),
        ("J_FRAME", J_FRAME),
        ("K_CONTEXT", K_CONTEXT),
        ("K_SEALED", K_SEALED),
        ("L_PROOF", L_PROOF),
    ] {
        assert!(published.iter().any(|b| b == hex), "{name} is not published in PROTOCOL.md as computed");
    }
}
