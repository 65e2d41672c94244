//! Tests of the client's frame protection without a drive: frames are built by
//! the client code and checked with `nasd_crypto::FrameKeys` exactly as a
//! drive checks them, and replies are built as a drive builds them. A small
//! in-process mock drive exercises the streaming paths end to end.

use super::auth::Guard;
use super::*;
use nasd_crypto::{key_context, mint_capability, open_key, FrameKeys, MacAlgorithm};
use nasd_proto::limits::{BLOCK_SIZE_MAX, BLOCK_SIZE_MIN, CHUNK_LEN_MIN, DATA_TAG_LEN, NONCE_LEN};
use nasd_proto::{encode_error_message, rights, CapabilityArgs, FramePrefix, KeyType};

const PLAIN_ARGS_MARKER: u64 = 0x5eed_cafe_f00d_beef;

fn all_protections() -> Vec<Protection> {
    (0u8..32).map(|b| Protection::from_bits(b).unwrap()).filter(|p| p.is_consistent()).collect()
}

fn cap_args(alg: MacAlgorithm) -> CapabilityArgs {
    CapabilityArgs {
        algorithm: alg as u8,
        min_protection: Protection::NONE,
        key_version: 3,
        drive_id: [9; 16],
        partition: 7,
        object: 16,
        region: CapabilityArgs::WHOLE_OBJECT,
        access_control_version: 1,
        rights: rights::READ | rights::WRITE,
        map_epoch: 0,
        expiration_ns: u64::MAX,
        audit_id: 42,
    }
}

/// The drive the guards in these tests protect requests for.
const DRIVE_ID: [u8; 16] = [0xd5; 16];

/// Every credential kind, with the (algorithm, key) a drive would find for it.
fn credentials() -> Vec<(Credential, MacAlgorithm, Key)> {
    let working = Key::random();
    let mut out = Vec::new();
    for (alg, sealed) in
        [(MacAlgorithm::Blake3, false), (MacAlgorithm::HmacSha256, false), (MacAlgorithm::Blake3, true)]
    {
        let (token, key) = mint_capability(&working, &cap_args(alg), sealed).unwrap();
        out.push((Credential::Capability { token, key: key.clone(), algorithm: alg }, alg, key));
    }
    let k = Key::random();
    out.push((Credential::Master(k.clone()), MacAlgorithm::Blake3, k));
    let k = Key::random();
    out.push((Credential::Drive(k.clone()), MacAlgorithm::Blake3, k));
    let k = Key::random();
    out.push((Credential::Partition { partition: 7, key: k.clone() }, MacAlgorithm::Blake3, k));
    let k = Key::random();
    out.push((Credential::Working { partition: 7, key_version: 3, key: k.clone() }, MacAlgorithm::Blake3, k));
    let shared = Key::random();
    for alg in [MacAlgorithm::Blake3, MacAlgorithm::HmacSha256] {
        let data = nasd_proto::IdentityData { algorithm: alg as u8, key_id: 2, user: 1000, role: 7, expiration_ns: 9 };
        let key = nasd_crypto::identity_key(&shared, &data).unwrap();
        // The drive MACs with the identity key bound to itself.
        let frame_key = nasd_crypto::identity_drive_key(&key, &data, &DRIVE_ID).unwrap();
        out.push((Credential::Identity { data, key }, alg, frame_key));
    }
    out
}

fn usable(credential: &Credential, protection: Protection) -> bool {
    match credential {
        Credential::Capability { token, .. } => {
            !protection.covers(Protection::PRIVACY_CAPABILITY) || token[0] == nasd_proto::CAPABILITY_FORMAT_SEALED
        }
        Credential::None => protection == Protection::NONE,
        // An identity credential is public: PRIVACY_CAPABILITY would hide nothing.
        Credential::Identity { .. } => {
            protection.covers(Protection::INTEGRITY_ARGS) && !protection.covers(Protection::PRIVACY_CAPABILITY)
        }
        _ => protection.covers(Protection::INTEGRITY_ARGS),
    }
}

fn sample_request() -> Request {
    // The partition number is a marker that must not appear under PRIVACY_ARGS.
    Request::Write {
        partition: PLAIN_ARGS_MARKER,
        object: 16,
        regions: vec![Region { offset: 0, length: 600 }, Region { offset: 4096, length: 424 }],
    }
}

fn request_header(req: &Request, data_len: u64, chunk_len: u32) -> FrameHeader {
    let mut h = FrameHeader::request(req.opcode(), 77);
    h.nonce = nasd_proto::nonce(1_700_000_000_000_000_000, 12345);
    h.data_len = data_len;
    h.chunk_len = if data_len > 0 { chunk_len } else { 0 };
    h
}

/// What a drive does with a request prefix: parse, verify the digest, decrypt.
fn drive_verify(frame: &[u8], alg: MacAlgorithm, key: &Key) -> Result<(FrameHeader, Request, [u8; 32]), &'static str> {
    let p = FramePrefix::parse(frame).map_err(|_| "parse")?;
    let keys = FrameKeys::new(alg, key);
    if !keys.verify_digest(p.header.protection, &frame[..frame.len() - 32], &p.digest) {
        return Err("digest");
    }
    let mut args = p.args.to_vec();
    if p.header.protection.covers(Protection::PRIVACY_ARGS) {
        keys.crypt_args(Kind::Request, &p.header.nonce, &mut args);
    }
    let req = Request::decode(p.header.opcode, &args).map_err(|_| "decode")?;
    Ok((p.header, req, p.digest))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn request_frames_verify_as_a_drive_would_for_every_protection() {
    let req = sample_request();
    let data: Vec<u8> = (0..1024u32).map(|i| (i * 7) as u8).collect();
    let mut checked = 0;
    for (credential, alg, key) in credentials() {
        for protection in all_protections() {
            if !usable(&credential, protection) {
                assert!(
                    Guard::new(&Auth::new(credential.clone(), protection), &DRIVE_ID).is_err(),
                    "{credential:?} {protection:?}"
                );
                continue;
            }
            let guard = Guard::new(&Auth::new(credential.clone(), protection), &DRIVE_ID).expect("usable auth");
            let mut h = request_header(&req, data.len() as u64, 512);
            let (frame, digest) = guard.seal_request(&mut h, req.encode_args());
            let (header, decoded, wire_digest) =
                drive_verify(&frame, alg, &key).unwrap_or_else(|e| panic!("{e}: {credential:?} {protection:?}"));
            assert_eq!(decoded, req);
            assert_eq!(wire_digest, digest);
            assert_eq!(header.key_type, credential.key_type());
            assert_eq!(header.protection, protection);
            let p = FramePrefix::parse(&frame).unwrap();
            match &credential {
                Credential::Capability { token, .. } => assert_eq!(p.capability, &token[..]),
                Credential::Partition { partition, .. } => assert_eq!(p.capability, &partition.to_le_bytes()),
                Credential::Working { partition, key_version, .. } => {
                    assert_eq!(p.capability, &[&partition.to_le_bytes()[..], &key_version.to_le_bytes()].concat()[..])
                }
                Credential::Identity { data, .. } => assert_eq!(p.capability, &data.encode()[..]),
                _ => assert!(p.capability.is_empty()),
            }
            let marker = PLAIN_ARGS_MARKER.to_le_bytes();
            assert_eq!(contains(p.args, &marker), !protection.covers(Protection::PRIVACY_ARGS), "{protection:?}");
            if !protection.covers(Protection::INTEGRITY_ARGS) {
                // Bearer proof: only ever for capabilities.
                assert_eq!(credential.key_type(), KeyType::Capability);
                assert_eq!(&digest, key.expose());
            }

            // Data: sealed by the client, opened by the drive's FrameKeys.
            let mut sealer = guard.data(Kind::Request, &h.nonce, &digest).unwrap();
            let mut opener = FrameKeys::new(alg, &key).data(Kind::Request, &header.nonce, protection, &wire_digest);
            let mut received = Vec::new();
            for index in 0..h.chunk_count() {
                let start = (index * h.chunk_len as u64) as usize;
                let mut chunk = data[start..start + h.chunk_size(index) as usize].to_vec();
                let tag = sealer.seal_chunk(&mut chunk);
                assert_eq!(tag.len(), protection.data_tag_len());
                assert_eq!(chunk == data[start..start + chunk.len()], !protection.covers(Protection::PRIVACY_DATA));
                opener.open_chunk(&mut chunk, &tag).expect("tag verifies");
                received.extend_from_slice(&chunk);
            }
            assert_eq!(received, data);
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} combinations checked");
}

#[test]
fn any_flipped_byte_of_a_protected_request_fails_the_drives_digest() {
    for (credential, alg, key) in credentials() {
        let protection = Protection::INTEGRITY_ARGS.union(Protection::PRIVACY_ARGS);
        let guard = Guard::new(&Auth::new(credential.clone(), protection), &DRIVE_ID).unwrap();
        let req = sample_request();
        let mut h = request_header(&req, 0, 0);
        let (frame, _) = guard.seal_request(&mut h, req.encode_args());
        assert!(drive_verify(&frame, alg, &key).is_ok());
        for i in 0..frame.len() {
            let mut bad = frame.clone();
            bad[i] ^= 0x01;
            assert!(drive_verify(&bad, alg, &key).is_err(), "{credential:?}: flip at byte {i} went unnoticed");
        }
        assert_eq!(drive_verify(&frame, alg, &Key::random()), Err("digest"));
    }
}

#[test]
fn data_tags_detect_a_flipped_byte_in_chunk_or_tag() {
    let key = Key::random();
    for protection in [
        Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA),
        Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA).union(Protection::PRIVACY_DATA),
    ] {
        let guard = Guard::new(&Auth::new(Credential::Drive(key.clone()), protection), &DRIVE_ID).unwrap();
        let nonce = nasd_proto::nonce(5, 6);
        let digest = [3u8; 32];
        let chunks: Vec<Vec<u8>> = (0..3).map(|c| vec![c as u8 + 1; 700]).collect();
        let mut sealer = guard.data(Kind::Request, &nonce, &digest).unwrap();
        let sealed: Vec<(Vec<u8>, Vec<u8>)> = chunks
            .iter()
            .map(|c| {
                let mut c = c.clone();
                let t = sealer.seal_chunk(&mut c);
                (c, t)
            })
            .collect();
        for bad_chunk in 0..3 {
            for pos in [0usize, 1, 350, 699, 700, 700 + 31] {
                let mut opener =
                    FrameKeys::new(MacAlgorithm::Blake3, &key).data(Kind::Request, &nonce, protection, &digest);
                for (i, (c, t)) in sealed.iter().enumerate() {
                    let (mut c, mut t) = (c.clone(), t.clone());
                    if i == bad_chunk {
                        if pos < 700 {
                            c[pos] ^= 0x80;
                        } else {
                            t[pos - 700] ^= 0x80;
                        }
                        assert!(opener.open_chunk(&mut c, &t).is_err(), "flip in chunk {i} at {pos} went unnoticed");
                        break;
                    }
                    opener.open_chunk(&mut c, &t).expect("untouched chunk verifies");
                    assert_eq!(c, chunks[i]);
                }
            }
        }
        // Reordered chunks fail too (tags are cumulative).
        let mut opener = FrameKeys::new(MacAlgorithm::Blake3, &key).data(Kind::Request, &nonce, protection, &digest);
        let (mut c, t) = sealed[1].clone();
        assert!(opener.open_chunk(&mut c, &t).is_err());
        // A reply's protector is not a request's: the same bytes do not verify.
        let mut opener = FrameKeys::new(MacAlgorithm::Blake3, &key).data(Kind::Reply, &nonce, protection, &[4u8; 32]);
        let (mut c, t) = sealed[0].clone();
        assert!(opener.open_chunk(&mut c, &t).is_err());
    }
}

#[test]
fn privacy_args_hides_the_arguments_and_sealed_keys() {
    let key = Key::random();
    let new_key = Key::from_bytes([0x42; 32]);
    let sealed = nasd_crypto::seal_key(&key, &key_context(opcode::SET_PARTITION_KEY, 5, 0), &new_key);
    let req = Request::SetPartitionKey { partition: PLAIN_ARGS_MARKER, sealed_key: sealed.clone() };
    let plain = req.encode_args();
    let guard = Guard::new(&Auth::new(Credential::Drive(key.clone()), key_management_protection()), &DRIVE_ID).unwrap();
    let mut h = request_header(&req, 0, 0);
    let (frame, _) = guard.seal_request(&mut h, plain.clone());
    let p = FramePrefix::parse(&frame).unwrap();
    assert_eq!(p.args.len(), plain.len());
    assert_ne!(p.args, &plain[..]);
    assert!(!contains(&frame, &PLAIN_ARGS_MARKER.to_le_bytes()));
    assert!(!contains(&frame, &sealed[..16]));
    assert!(!contains(&frame, new_key.expose()));
    assert!(!contains(&frame, key.expose()));
    // Same request, two nonces: different ciphertexts.
    let mut h2 = request_header(&req, 0, 0);
    h2.nonce = nasd_proto::nonce(1, 2);
    let (frame2, _) = guard.seal_request(&mut h2, plain.clone());
    assert_ne!(FramePrefix::parse(&frame2).unwrap().args, p.args);
    // The drive recovers it.
    let (_, decoded, _) = drive_verify(&frame, MacAlgorithm::Blake3, &key).unwrap();
    assert_eq!(decoded, req);
}

#[test]
fn unusable_auth_is_refused_before_sending() {
    let k = Key::random();
    let clear = mint_capability(&k, &cap_args(MacAlgorithm::Blake3), false).unwrap().0;
    let cap = |token: Vec<u8>| Credential::Capability { token, key: k.clone(), algorithm: MacAlgorithm::Blake3 };
    let cases = [
        Auth::new(Credential::Master(k.clone()), Protection::NONE),
        Auth::new(Credential::Drive(k.clone()), Protection::INTEGRITY_DATA),
        Auth::new(Credential::None, Protection::INTEGRITY_ARGS),
        Auth::new(Credential::Partition { partition: 1, key: k.clone() }, Protection::PRIVACY_ARGS),
        Auth::new(cap(clear.clone()), Protection::INTEGRITY_ARGS.union(Protection::PRIVACY_CAPABILITY)),
        Auth::new(cap(Vec::new()), Protection::INTEGRITY_ARGS),
        Auth::new(cap(vec![1; 513]), Protection::INTEGRITY_ARGS),
        Auth::new(cap(clear.clone()), Protection::INTEGRITY_ARGS.union(Protection::PRIVACY_DATA)),
    ];
    for auth in cases {
        assert!(Guard::new(&auth, &DRIVE_ID).is_err(), "{auth:?} accepted");
    }
    // A capability under NO_PROTECTION is allowed (bearer proof, the drive decides).
    assert!(Guard::new(&Auth::new(cap(clear), Protection::NONE), &DRIVE_ID).is_ok());
    assert!(Guard::new(&Auth::default(), &DRIVE_ID).is_ok());
}

#[test]
fn debug_output_never_contains_keys() {
    let k = Key::from_bytes([0xab; 32]);
    for c in [
        Credential::Master(k.clone()),
        Credential::Drive(k.clone()),
        Credential::Partition { partition: 1, key: k.clone() },
        Credential::Working { partition: 1, key_version: 2, key: k.clone() },
        Credential::Capability { token: vec![0xab; 88], key: k.clone(), algorithm: MacAlgorithm::Blake3 },
    ] {
        let s = format!("{:?}", Auth::new(c, Protection::INTEGRITY_ARGS));
        assert!(!s.to_lowercase().contains("ab, ab") && !s.contains("171") && !s.contains(&k.to_hex()), "{s}");
        assert!(s.contains("redacted"), "{s}");
    }
}

// ------------------------------------------------------------------ replies

/// A reply prefix built as a drive builds it (see crates/drive conn.rs).
#[allow(clippy::too_many_arguments)]
fn drive_reply(
    keys: Option<&FrameKeys>,
    request_digest: &[u8; 32],
    request: &FrameHeader,
    status: Status,
    mut args: Vec<u8>,
    nonce: [u8; NONCE_LEN],
    data_len: u64,
    chunk_len: u32,
) -> (Vec<u8>, [u8; 32]) {
    let mut h = FrameHeader::reply_to(request, status);
    h.nonce = nonce;
    h.data_len = data_len;
    h.chunk_len = if data_len > 0 { chunk_len } else { 0 };
    let Some(keys) = keys else {
        h.key_type = KeyType::None;
        h.protection = Protection::NONE;
        return (FramePrefix::encode(&h, &[], &args, &[0; 32]), [0; 32]);
    };
    if h.protection.covers(Protection::PRIVACY_ARGS) {
        keys.crypt_args(Kind::Reply, &h.nonce, &mut args);
    }
    let mut bytes = FramePrefix::encode(&h, &[], &args, &[0; 32]);
    let split = bytes.len() - 32;
    let digest = keys.reply_digest(h.protection, request_digest, &bytes[..split]);
    bytes[split..].copy_from_slice(&digest);
    (bytes, digest)
}

fn is_bad_reply<T>(r: &Result<T, ClientError>) -> bool {
    matches!(r, Err(ClientError::BadReply(_)) | Err(ClientError::Protocol(_)))
}

#[test]
fn replies_are_verified_and_decrypted() {
    for (credential, alg, key) in credentials() {
        for protection in all_protections() {
            if !usable(&credential, protection) {
                continue;
            }
            let guard = Guard::new(&Auth::new(credential.clone(), protection), &DRIVE_ID).unwrap();
            let req = Request::GetAttr { partition: 7, object: 16 };
            let mut h = request_header(&req, 0, 0);
            let (_, req_digest) = guard.seal_request(&mut h, req.encode_args());
            let keys = FrameKeys::new(alg, &key);
            let results =
                Reply::Attrs(Attributes { logical_size: PLAIN_ARGS_MARKER, ..Attributes::default() }).encode();
            let nonce = nasd_proto::nonce(99, 1);
            let (frame, digest) = drive_reply(Some(&keys), &req_digest, &h, Status::Ok, results.clone(), nonce, 0, 0);
            let checked = guard.check_reply(&h, &req_digest, &frame).expect("genuine reply");
            let integrity = protection.covers(Protection::INTEGRITY_ARGS);
            assert_eq!(checked.authenticated, integrity);
            assert_eq!(checked.args, results);
            assert_eq!(checked.digest, digest);
            assert_eq!(
                contains(&frame, &PLAIN_ARGS_MARKER.to_le_bytes()),
                !protection.covers(Protection::PRIVACY_ARGS)
            );

            // Every flipped byte is caught (under NO_PROTECTION nothing is:
            // the reply's digest is zero).
            for i in (0..frame.len()).filter(|_| integrity) {
                let mut bad = frame.clone();
                bad[i] ^= 0x10;
                assert!(
                    is_bad_reply(&guard.check_reply(&h, &req_digest, &bad)),
                    "{credential:?} {protection:?}: flip at {i}"
                );
            }
            // Made with another key (without integrity a reply proves nothing).
            let other = FrameKeys::new(alg, &Key::random());
            let (forged, _) = drive_reply(Some(&other), &req_digest, &h, Status::Ok, results.clone(), nonce, 0, 0);
            if integrity {
                assert!(matches!(guard.check_reply(&h, &req_digest, &forged), Err(ClientError::BadReply(_))));
            }
            // A genuine reply to another request (replayed).
            let mut h_other = h.clone();
            h_other.request_id += 1;
            let (replayed, _) =
                drive_reply(Some(&keys), &req_digest, &h_other, Status::Ok, results.clone(), nonce, 0, 0);
            assert!(matches!(guard.check_reply(&h, &req_digest, &replayed), Err(ClientError::BadReply(_))));
            let mut h_op = h.clone();
            h_op.opcode = opcode::SETATTR;
            let (replayed, _) = drive_reply(Some(&keys), &req_digest, &h_op, Status::Ok, results.clone(), nonce, 0, 0);
            assert!(matches!(guard.check_reply(&h, &req_digest, &replayed), Err(ClientError::BadReply(_))));
            // An unprotected success is never believed.
            let (naked, _) = drive_reply(None, &req_digest, &h, Status::Ok, results.clone(), nonce, 0, 0);
            assert!(matches!(guard.check_reply(&h, &req_digest, &naked), Err(ClientError::BadReply(_))));
            // A success under other protection (downgrade) is refused.
            for p in all_protections().into_iter().filter(|p| *p != protection) {
                let mut hp = h.clone();
                hp.protection = p;
                let (downgraded, _) =
                    drive_reply(Some(&keys), &req_digest, &hp, Status::Ok, results.clone(), nonce, 0, 0);
                assert!(matches!(guard.check_reply(&h, &req_digest, &downgraded), Err(ClientError::BadReply(_))));
            }
            // A protected refusal verifies and its message decrypts.
            let msg = encode_error_message("no such object");
            let (refusal, _) =
                drive_reply(Some(&keys), &req_digest, &h, Status::NoSuchObject, msg.clone(), nonce, 0, 0);
            let checked = guard.check_reply(&h, &req_digest, &refusal).unwrap();
            assert_eq!(checked.authenticated, integrity);
            assert!(
                matches!(checked.refusal(), Err(ClientError::Status { status: Status::NoSuchObject, ref message }) if message == "no such object")
            );
            let mut bad = refusal.clone();
            let n = bad.len();
            bad[n - 40] ^= 1;
            if integrity {
                assert!(matches!(guard.check_reply(&h, &req_digest, &bad), Err(ClientError::BadReply(_))));
            }
            // An unprotected refusal is accepted as a status, unauthenticated.
            let (naked, _) = drive_reply(None, &req_digest, &h, Status::BadDigest, msg, nonce, 0, 0);
            let checked = guard.check_reply(&h, &req_digest, &naked).unwrap();
            assert!(!checked.authenticated);
            assert_eq!(checked.refusal().unwrap_err().status(), Some(Status::BadDigest));
        }
    }
}

#[test]
fn unprotected_client_accepts_only_unprotected_replies() {
    let guard = Guard::none();
    let req = Request::Inquiry;
    let mut h = request_header(&req, 0, 0);
    let (frame, digest) = guard.seal_request(&mut h, req.encode_args());
    assert_eq!(digest, [0; 32]);
    let p = FramePrefix::parse(&frame).unwrap();
    assert_eq!((p.header.key_type, p.header.protection, p.capability.len()), (KeyType::None, Protection::NONE, 0));
    let (reply, _) = drive_reply(None, &digest, &h, Status::Ok, Reply::Done.encode(), [0; 16], 0, 0);
    assert!(!guard.check_reply(&h, &digest, &reply).unwrap().authenticated);
    let mut hp = h.clone();
    hp.key_type = KeyType::Drive;
    hp.protection = Protection::INTEGRITY_ARGS;
    let (protected, _) = drive_reply(
        Some(&FrameKeys::new(MacAlgorithm::Blake3, &Key::random())),
        &digest,
        &hp,
        Status::Ok,
        vec![],
        [0; 16],
        0,
        0,
    );
    assert!(matches!(guard.check_reply(&h, &digest, &protected), Err(ClientError::BadReply(_))));
}

#[test]
fn encode_args_refuses_what_the_wire_cannot_carry() {
    let regions = vec![Region { offset: 0, length: 1 }; u16::MAX as usize + 1];
    let r = encode_args(&Request::Read { partition: 1, object: 16, regions }, 0);
    assert!(matches!(r, Err(ClientError::InvalidRequest(_))));
    let r = encode_args(&Request::GetAttr { partition: 1, object: 16 }, DATA_LEN_MAX + 1);
    assert!(matches!(r, Err(ClientError::InvalidRequest(_))));
    let regions = vec![Region { offset: 0, length: 1 }; 5000];
    assert!(matches!(
        encode_args(&Request::Write { partition: 1, object: 16, regions }, 0),
        Err(ClientError::InvalidRequest(_))
    ));
}

// --------------------------------------------------------------- mock drive

mod mock {
    use super::*;
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// How the mock misbehaves on its next protected reply.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub enum Tamper {
        None,
        /// Flip a bit of the first reply data chunk.
        DataByte,
        /// Flip a bit of the reply's arguments.
        ArgsByte,
        /// Answer with another request id.
        RequestId,
        /// Refuse, unprotected.
        NakedRefusal,
        /// Succeed, unprotected.
        NakedSuccess,
    }

    pub struct State {
        /// Keys by key type (the mock accepts any capability selector).
        pub keys: Vec<(KeyType, MacAlgorithm, Key)>,
        pub clock_offset_ns: i64,
        pub tamper: Tamper,
        /// Every authenticated request: (header, request).
        pub log: Vec<(FrameHeader, Request)>,
        /// Keys opened from key-management requests.
        pub opened: Vec<Key>,
        pub object: Vec<u8>,
        pub read_chunk: u32,
        /// (chunk_len_max, block_size) the mock's HELLO reply names.
        pub hello_sizes: (u32, u32),
    }

    pub type Shared = std::sync::Arc<Mutex<State>>;

    fn now(state: &Shared) -> u64 {
        super::local_ns().saturating_add_signed(state.lock().unwrap().clock_offset_ns)
    }

    pub async fn start(state: Shared) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let state = state.clone();
                tokio::spawn(async move {
                    let _ = serve(socket, state).await;
                });
            }
        });
        addr
    }

    async fn serve(socket: tokio::net::TcpStream, state: Shared) -> std::io::Result<()> {
        let (mut rd, mut wr) = socket.into_split();
        let mut seq = 0u64;
        loop {
            let mut frame = vec![0u8; HEADER_LEN];
            if rd.read_exact(&mut frame).await.is_err() {
                return Ok(());
            }
            let header = FrameHeader::decode(frame[..].try_into().unwrap()).expect("client sends valid headers");
            frame.resize(HEADER_LEN + header.body_len(), 0);
            rd.read_exact(&mut frame[HEADER_LEN..]).await?;
            let p = FramePrefix::parse(&frame).unwrap();
            seq += 1;
            let reply_nonce = nasd_proto::nonce(now(&state), seq);
            let found = state
                .lock()
                .unwrap()
                .keys
                .iter()
                .find(|(t, _, _)| *t == header.key_type)
                .map(|(_, a, k)| (*a, k.clone()));
            let keys = match (header.key_type, found) {
                (KeyType::None, _) => None,
                (_, Some((alg, key))) => Some(FrameKeys::new(alg, &key)),
                (_, None) => panic!("mock has no key for {:?}", header.key_type),
            };
            if let Some(k) = &keys {
                if !k.verify_digest(header.protection, &frame[..frame.len() - 32], &p.digest) {
                    let (bytes, _) = drive_reply(
                        None,
                        &p.digest,
                        &header,
                        Status::BadDigest,
                        encode_error_message("bad digest"),
                        reply_nonce,
                        0,
                        0,
                    );
                    wr.write_all(&bytes).await?;
                    continue;
                }
            }
            let mut args = p.args.to_vec();
            if header.protection.covers(Protection::PRIVACY_ARGS) {
                keys.as_ref().unwrap().crypt_args(Kind::Request, &header.nonce, &mut args);
            }
            let req = Request::decode(header.opcode, &args).expect("client sends valid args");
            let tamper = std::mem::replace(&mut state.lock().unwrap().tamper, Tamper::None);
            // Request data, checked chunk by chunk.
            let mut opener = keys.as_ref().map(|k| k.data(Kind::Request, &header.nonce, header.protection, &p.digest));
            let mut data = Vec::new();
            let mut tag = vec![0u8; header.protection.data_tag_len()];
            for i in 0..header.chunk_count() {
                let mut chunk = vec![0u8; header.chunk_size(i) as usize];
                rd.read_exact(&mut chunk).await?;
                rd.read_exact(&mut tag).await?;
                if let Some(o) = opener.as_mut() {
                    o.open_chunk(&mut chunk, &tag).expect("request data tag verifies");
                }
                data.extend_from_slice(&chunk);
            }
            let mut reply_data = Vec::new();
            let results = {
                let mut st = state.lock().unwrap();
                st.log.push((header.clone(), req.clone()));
                let master = st.keys.iter().find(|k| k.0 == KeyType::Master).map(|k| k.2.clone());
                let drive = st.keys.iter().find(|k| k.0 == KeyType::Drive).map(|k| k.2.clone());
                let partition = st.keys.iter().find(|k| k.0 == KeyType::Partition).map(|k| k.2.clone());
                match &req {
                    Request::Hello { .. } => Reply::Hello {
                        version: VERSION,
                        drive_id: [5; 16],
                        chunk_len_max: st.hello_sizes.0,
                        regions_max: 1024,
                        block_size: st.hello_sizes.1,
                    },
                    Request::GetAttr { .. } => Reply::Attrs(Attributes::default()),
                    Request::Write { .. } => {
                        st.object = data.clone();
                        Reply::Written { length: data.len() as u64 }
                    }
                    Request::Read { regions, .. } => {
                        let lengths: Vec<u64> = regions.iter().map(|r| r.length).collect();
                        reply_data = st.object[..lengths.iter().sum::<u64>() as usize].to_vec();
                        Reply::Read { lengths }
                    }
                    Request::Initialize { sealed_master_key, .. } => {
                        if !sealed_master_key.is_empty() {
                            let k =
                                open_key(&master.unwrap(), &key_context(opcode::INITIALIZE, 0, 0), sealed_master_key)
                                    .unwrap();
                            st.opened.push(k);
                        }
                        Reply::Done
                    }
                    Request::SetDriveKey { sealed_key } => {
                        st.opened.push(
                            open_key(&master.unwrap(), &key_context(opcode::SET_DRIVE_KEY, 0, 0), sealed_key).unwrap(),
                        );
                        Reply::Done
                    }
                    Request::SetPartitionKey { partition: p, sealed_key } => {
                        st.opened.push(
                            open_key(&drive.unwrap(), &key_context(opcode::SET_PARTITION_KEY, *p, 0), sealed_key)
                                .unwrap(),
                        );
                        Reply::Done
                    }
                    Request::SetWorkingKey { partition: p, key_version, sealed_key } => {
                        let ctx = key_context(opcode::SET_WORKING_KEY, *p, *key_version);
                        st.opened.push(open_key(&partition.unwrap(), &ctx, sealed_key).unwrap());
                        Reply::Done
                    }
                    Request::SetMinProtection { .. } => Reply::Done,
                    Request::ReadAudit { after, .. } => Reply::Audit {
                        records: vec![AuditRecord {
                            sequence: after + 1,
                            time_ns: 1,
                            audit_id: 0,
                            key_type: header.key_type as u8,
                            opcode: header.opcode,
                            status: 0,
                            partition: 0,
                            object: 0,
                            region: Region { offset: 0, length: 0 },
                        }],
                    },
                    other => panic!("mock does not do {other:?}"),
                }
            };
            let mut reply_header = header.clone();
            if tamper == Tamper::RequestId {
                reply_header.request_id ^= 1;
            }
            let read_chunk = state.lock().unwrap().read_chunk;
            let (mut bytes, digest) = match tamper {
                Tamper::NakedRefusal => {
                    let (b, _) = drive_reply(
                        None,
                        &p.digest,
                        &header,
                        Status::BadDigest,
                        encode_error_message("refused"),
                        reply_nonce,
                        0,
                        0,
                    );
                    wr.write_all(&b).await?;
                    continue;
                }
                Tamper::NakedSuccess => drive_reply(
                    None,
                    &p.digest,
                    &reply_header,
                    Status::Ok,
                    results.encode(),
                    reply_nonce,
                    reply_data.len() as u64,
                    read_chunk,
                ),
                _ => drive_reply(
                    keys.as_ref(),
                    &p.digest,
                    &reply_header,
                    Status::Ok,
                    results.encode(),
                    reply_nonce,
                    reply_data.len() as u64,
                    read_chunk,
                ),
            };
            if tamper == Tamper::ArgsByte {
                let n = bytes.len();
                bytes[n - 33] ^= 4;
            }
            wr.write_all(&bytes).await?;
            let mut sealer = keys.as_ref().map(|k| k.data(Kind::Reply, &reply_nonce, header.protection, &digest));
            for (i, chunk) in reply_data.chunks(read_chunk as usize).enumerate() {
                let mut chunk = chunk.to_vec();
                let tag = match (&mut sealer, tamper) {
                    (_, Tamper::NakedSuccess) | (None, _) => Vec::new(),
                    (Some(s), _) => s.seal_chunk(&mut chunk),
                };
                if tamper == Tamper::DataByte && i == 0 {
                    chunk[0] ^= 1;
                }
                wr.write_all(&chunk).await?;
                wr.write_all(&tag).await?;
            }
        }
    }
}

use mock::{State, Tamper};

fn mock_state(keys: Vec<(KeyType, MacAlgorithm, Key)>) -> mock::Shared {
    std::sync::Arc::new(std::sync::Mutex::new(State {
        keys,
        clock_offset_ns: 3_600_000_000_000, // the drive clock runs an hour ahead
        tamper: Tamper::None,
        log: Vec::new(),
        opened: Vec::new(),
        object: Vec::new(),
        read_chunk: 512,
        hello_sizes: (1 << 20, 4096),
    }))
}

/// The HELLO reply is unauthenticated: a block size that is not a power of
/// two within the protocol's limits, or a chunk limit below CHUNK_LEN_MIN
/// (which would make every write's chunk count divide by zero), is refused
/// at connect with a protocol error, never used.
#[tokio::test]
async fn hello_sizes_outside_the_protocol_limits_are_refused() {
    let state = mock_state(Vec::new());
    let addr = mock::start(state.clone()).await;
    let bad = [
        (1 << 20, 0),
        (1 << 20, 4097),
        (1 << 20, 2048),
        (1 << 20, 3 << 12),
        (1 << 20, 2 << 20),
        (1 << 20, u32::MAX),
        (0, 4096),
        (CHUNK_LEN_MIN - 1, 4096),
    ];
    for sizes in bad {
        state.lock().unwrap().hello_sizes = sizes;
        match DriveClient::connect(addr).await {
            Err(ClientError::Protocol(m)) => assert!(m.contains("HELLO"), "{sizes:?}: {m}"),
            other => panic!("{sizes:?}: {other:?}"),
        }
    }
    for sizes in [(CHUNK_LEN_MIN, BLOCK_SIZE_MIN), (1 << 20, BLOCK_SIZE_MAX), (4 << 20, 65536)] {
        state.lock().unwrap().hello_sizes = sizes;
        let c = DriveClient::connect(addr).await.unwrap_or_else(|e| panic!("{sizes:?}: {e}"));
        assert_eq!((c.block_size, c.chunk_len), (sizes.1, CHUNK_LEN_DEFAULT.min(sizes.0)));
    }
}

#[tokio::test]
async fn protected_write_and_read_through_a_mock_drive() {
    let working = Key::random();
    let alg = MacAlgorithm::HmacSha256;
    let (token, cap_key) = mint_capability(&working, &cap_args(alg), true).unwrap();
    let state = mock_state(vec![(KeyType::Capability, alg, cap_key.clone())]);
    let addr = mock::start(state.clone()).await;
    let mut c = DriveClient::connect(addr).await.unwrap();
    let offset = c.drive_time_ns() as i128 - local_ns() as i128;
    assert!(offset.abs() < 2_000_000_000, "the unauthenticated HELLO reply's time must not be trusted ({offset})");

    let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let regions = [Region { offset: 0, length: 3000 }, Region { offset: 8192, length: 2000 }];
    for protection in all_protections() {
        c.set_auth(Auth::new(
            Credential::Capability { token: token.clone(), key: cap_key.clone(), algorithm: alg },
            protection,
        ));
        c.set_chunk_len(1024);
        assert_eq!(c.write(7, 16, &regions, &data).await.unwrap(), 5000, "{protection:?}");
        assert_eq!(state.lock().unwrap().object, data);
        let (lengths, back) = c.read(7, 16, &regions).await.unwrap();
        assert_eq!((lengths, back.len()), (vec![3000, 2000], 5000));
        assert_eq!(back, data, "{protection:?}");
        c.getattr(7, 16).await.unwrap();
        if protection.covers(Protection::INTEGRITY_ARGS) {
            let offset = c.drive_time_ns() as i128 - local_ns() as i128;
            assert!(
                (offset - 3_600_000_000_000).abs() < 2_000_000_000,
                "clock offset {offset} not learnt from an authenticated reply"
            );
        }
    }
    // Nonces: unique, consecutive sequence numbers, time on the drive clock.
    let st = state.lock().unwrap();
    let nonces: Vec<_> = st.log.iter().filter(|(h, _)| h.key_type != KeyType::None).map(|(h, _)| h.nonce).collect();
    assert!(nonces.len() > 30);
    let mut unique = nonces.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), nonces.len());
    for w in nonces.windows(2) {
        let s = |n: &[u8; 16]| u64::from_le_bytes(n[8..].try_into().unwrap());
        assert_eq!(s(&w[1]), s(&w[0]).wrapping_add(1));
    }
    // Once an authenticated reply taught the drive clock, nonces use it.
    let drive_now = local_ns() as i128 + 3_600_000_000_000;
    let last = nonces.last().unwrap();
    assert!((nonce_time(last) as i128 - drive_now).abs() < 10_000_000_000);
    // Request ids increase by one per request and do not start at a fixed value.
    let ids: Vec<u64> = st.log.iter().map(|(h, _)| h.request_id).collect();
    assert!(ids.windows(2).all(|w| w[1] == w[0].wrapping_add(1)));
}

#[tokio::test]
async fn tampered_replies_are_refused_and_break_the_connection() {
    let key = Key::random();
    let protection = Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA);
    let state = mock_state(vec![(KeyType::Drive, MacAlgorithm::Blake3, key.clone())]);
    let addr = mock::start(state.clone()).await;
    let region = [Region { offset: 0, length: 2000 }];
    for tamper in [Tamper::DataByte, Tamper::ArgsByte, Tamper::RequestId, Tamper::NakedSuccess] {
        let mut c = DriveClient::connect(addr).await.unwrap();
        c.set_auth(Auth::new(Credential::Drive(key.clone()), protection));
        c.write(7, 16, &region, &[9u8; 2000]).await.unwrap();
        state.lock().unwrap().tamper = tamper;
        let mut dst = Vec::new();
        let r = c.read_to(7, 16, &region, &mut dst).await;
        assert!(matches!(r, Err(ClientError::BadReply(_))), "{tamper:?}: {r:?}");
        assert!(dst.is_empty(), "{tamper:?}: unverified data reached the caller");
        assert!(matches!(c.getattr(7, 16).await, Err(ClientError::Broken)), "{tamper:?}");
    }
    // An unprotected refusal is a status; the connection goes on.
    let mut c = DriveClient::connect(addr).await.unwrap();
    c.set_auth(Auth::new(Credential::Drive(key.clone()), protection));
    state.lock().unwrap().tamper = Tamper::NakedRefusal;
    assert_eq!(c.getattr(7, 16).await.unwrap_err().status(), Some(Status::BadDigest));
    c.getattr(7, 16).await.unwrap();
    // A wrong key: the mock refuses (unprotected) and nothing else happens.
    c.set_auth(Auth::new(Credential::Drive(Key::random()), protection));
    assert_eq!(c.getattr(7, 16).await.unwrap_err().status(), Some(Status::BadDigest));
    // An unusable auth is refused locally and the connection stays usable.
    c.set_auth(Auth::new(Credential::Drive(key.clone()), Protection::NONE));
    assert!(matches!(c.getattr(7, 16).await, Err(ClientError::InvalidRequest(_))));
    c.set_auth(Auth::new(Credential::Drive(key.clone()), protection));
    c.getattr(7, 16).await.unwrap();
}

#[tokio::test]
async fn key_management_seals_keys_for_their_slots() {
    let (master, drive, partition) = (Key::random(), Key::random(), Key::random());
    let state = mock_state(vec![
        (KeyType::Master, MacAlgorithm::Blake3, master.clone()),
        (KeyType::Drive, MacAlgorithm::Blake3, drive.clone()),
        (KeyType::Partition, MacAlgorithm::Blake3, partition.clone()),
    ]);
    let addr = mock::start(state.clone()).await;
    let mut c = DriveClient::connect(addr).await.unwrap();
    let (k1, k2, k3, k4) = (Key::random(), Key::random(), Key::random(), Key::random());
    c.initialize(&master, Some(&k1), 0, 1_000_000_000).await.unwrap();
    c.initialize(&master, None, 0, 1_000_000_000).await.unwrap();
    c.set_drive_key(&master, &k2).await.unwrap();
    c.set_partition_key(&drive, 7, &k3).await.unwrap();
    c.set_working_key(&partition, 7, 2, &k4).await.unwrap();
    c.set_min_protection(&Credential::Drive(drive.clone()), 0, Protection::INTEGRITY_ARGS).await.unwrap();
    c.set_min_protection(
        &Credential::Partition { partition: 7, key: partition.clone() },
        7,
        Protection::INTEGRITY_ARGS,
    )
    .await
    .unwrap();
    let records = c.read_audit(&drive, 10, 5).await.unwrap();
    assert_eq!(records[0].sequence, 11);
    assert_eq!(state.lock().unwrap().opened, vec![k1, k2, k3, k4]);
    let st = state.lock().unwrap();
    let kinds: Vec<(KeyType, Protection, u16)> =
        st.log.iter().map(|(h, _)| (h.key_type, h.protection, h.opcode)).collect();
    let km = key_management_protection();
    assert_eq!(
        kinds[1..],
        [
            (KeyType::Master, km, opcode::INITIALIZE),
            (KeyType::Master, km, opcode::INITIALIZE),
            (KeyType::Master, km, opcode::SET_DRIVE_KEY),
            (KeyType::Drive, km, opcode::SET_PARTITION_KEY),
            (KeyType::Partition, km, opcode::SET_WORKING_KEY),
            (KeyType::Drive, km, opcode::SET_MIN_PROTECTION),
            (KeyType::Partition, km, opcode::SET_MIN_PROTECTION),
            (KeyType::Drive, km, opcode::READ_AUDIT),
        ]
    );
    drop(st);
    // The client's own auth is untouched by key management.
    assert!(matches!(c.auth().credential, Credential::None));
    assert_eq!(c.auth().protection, Protection::NONE);
}

#[test]
fn data_tag_len_matches_protocol() {
    assert_eq!(key_management_protection().data_tag_len(), 0);
    assert_eq!(Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA).data_tag_len(), DATA_TAG_LEN);
}

/// A reply answers exactly one request: a genuine reply made for another
/// request (same id and opcode, other digest) does not verify.
#[test]
fn replies_are_bound_to_their_request() {
    let key = Key::random();
    let credential = Credential::Drive(key.clone());
    let guard = Guard::new(&Auth::new(credential, Protection::INTEGRITY_ARGS), &DRIVE_ID).unwrap();
    let req = Request::Inquiry;
    let mut h = request_header(&req, 0, 0);
    let (_, digest) = guard.seal_request(&mut h, req.encode_args());
    let keys = FrameKeys::new(MacAlgorithm::Blake3, &key);
    let (genuine, _) = drive_reply(Some(&keys), &digest, &h, Status::Ok, Reply::Done.encode(), [3; 16], 0, 0);
    assert!(guard.check_reply(&h, &digest, &genuine).unwrap().authenticated);
    let mut other = digest;
    other[0] ^= 1;
    let (for_other, _) = drive_reply(Some(&keys), &other, &h, Status::Ok, Reply::Done.encode(), [3; 16], 0, 0);
    assert!(matches!(guard.check_reply(&h, &digest, &for_other), Err(ClientError::BadReply(_))));
}

/// An identity with an unknown algorithm is refused locally; `set_identity`
/// with anything but an identity credential makes the requests that would
/// go under it fail without sending anything.
#[test]
fn identities_that_cannot_be_used_are_refused_locally() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let data = nasd_proto::IdentityData { algorithm: 3, key_id: 1, user: 1, role: 0, expiration_ns: 1 };
    let bad = Credential::Identity { data, key: Key::random() };
    let refused = Guard::new(&Auth::new(bad, Protection::INTEGRITY_ARGS), &DRIVE_ID).err().expect("refused");
    assert!(refused.contains("unknown MAC algorithm"), "{refused}");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mock = tokio::spawn(async move {
            // Answers HELLO, then expects nothing more.
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = [0u8; nasd_proto::limits::HEADER_LEN];
            s.read_exact(&mut head).await.unwrap();
            let h = FrameHeader::decode(&head).unwrap();
            let mut rest = vec![0u8; h.body_len()];
            s.read_exact(&mut rest).await.unwrap();
            let reply = Reply::Hello {
                version: VERSION,
                drive_id: [1; 16],
                chunk_len_max: nasd_proto::limits::CHUNK_LEN_MAX,
                regions_max: 1024,
                block_size: 4096,
            };
            let rh = FrameHeader::reply_to(&h, Status::Ok);
            s.write_all(&FramePrefix::encode(&rh, &[], &reply.encode(), &[0; 32])).await.unwrap();
            let mut more = [0u8; 1];
            assert_eq!(s.read(&mut more).await.unwrap(), 0, "nothing sent after HELLO");
        });
        let mut c = DriveClient::connect(addr).await.unwrap();
        c.set_identity(Some(Auth::new(Credential::Drive(Key::random()), Protection::INTEGRITY_ARGS)));
        let e = c.read(7, 16, &[Region { offset: 0, length: 1 }]).await.unwrap_err();
        assert!(matches!(&e, ClientError::InvalidRequest(m) if m.contains("identity credential")), "{e}");
        drop(c);
        mock.await.unwrap();
    });
}

/// An identity's requests are MACed for one drive: the drive they were
/// sealed for verifies them, any other drive (same identity key K, same
/// credential) does not. Other credentials' keys are one drive's already and
/// do not depend on the drive id.
#[test]
fn identity_frames_are_bound_to_their_drive() {
    let shared = Key::random();
    let data = nasd_proto::IdentityData { algorithm: 1, key_id: 1, user: 1000, role: 0, expiration_ns: 9 };
    let idkey = nasd_crypto::identity_key(&shared, &data).unwrap();
    let credential = Credential::Identity { data, key: idkey.clone() };
    let req = sample_request();
    let mut other = DRIVE_ID;
    other[0] ^= 0x80;
    let guard = Guard::new(&Auth::new(credential, Protection::INTEGRITY_ARGS), &DRIVE_ID).unwrap();
    let mut h = request_header(&req, 0, 0);
    let (frame, _) = guard.seal_request(&mut h, req.encode_args());
    let at = |drive: &[u8; 16]| nasd_crypto::identity_drive_key(&idkey, &data, drive).unwrap();
    assert!(drive_verify(&frame, MacAlgorithm::Blake3, &at(&DRIVE_ID)).is_ok());
    assert_eq!(drive_verify(&frame, MacAlgorithm::Blake3, &at(&other)).err(), Some("digest"));
    assert_eq!(drive_verify(&frame, MacAlgorithm::Blake3, &idkey).err(), Some("digest"), "not the bare idkey");
    let drive_key = Key::random();
    let sealed = |drive: &[u8; 16]| {
        let g = Guard::new(&Auth::new(Credential::Drive(drive_key.clone()), Protection::INTEGRITY_ARGS), drive);
        let mut h = request_header(&req, 0, 0);
        g.unwrap().seal_request(&mut h, req.encode_args()).0
    };
    assert_eq!(sealed(&DRIVE_ID), sealed(&other), "a drive key is the drive's own");
}
