//! Decentralized authorization (DSFS) on a real drive over loopback with
//! security enforced: identity keys installed and retired by the drive's
//! owner, requests authorized by an identity credential against the
//! objects' pre-authorization lists (access PALs and the super PALs of PAL
//! collections) with no capability, and the partition scheme that decides
//! which kind a partition accepts.
//!
//! Every attack case ends by checking that nothing changed (the object's
//! bytes) and that the honest path still works, so each can fail: a drive
//! that skipped the check would let the request through and change the
//! object, or answer with another status.

mod common;

use common::{refused, rg, Drive, Options, OTHER, P, PROTECTION};
use nasd_client::{Auth, ClientError, Credential, DriveClient};
use nasd_crypto::{identity_drive_key, identity_key, FrameKeys, Key, MacAlgorithm};
use nasd_drive::{DriveConfig, SecurityMode};
use nasd_proto::limits::{HEADER_LEN, PAL_ENTRIES_MAX};
use nasd_proto::{
    rights, AttrMask, Attributes, AuthScheme, FrameHeader, FramePrefix, IdentityData, KeyType, ObjectPal, Pal,
    PalEntry, Principal, Protection, Region, Request, Status, IDENTITY_DATA_LEN,
};
use nasd_store::{Store, StoreOptions};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ALICE: u32 = 1000;
const BOB: u32 = 1001;
const MALLORY: u32 = 666;
const EDITORS: u32 = 7;
const READERS: u32 = 3;
const NO_ROLE: u32 = nasd_proto::ROLE_NONE;
const DATA: &[u8] = b"pre-authorized bytes";
const R: u32 = rights::READ | rights::GETATTR;
const RW: u32 = rights::READ | rights::WRITE | rights::GETATTR;
const COLLECTION: u64 = 9;

fn user(id: u32, rights: u32) -> PalEntry {
    PalEntry { principal: Principal::User(id), rights }
}

fn role(id: u32, rights: u32) -> PalEntry {
    PalEntry { principal: Principal::Role(id), rights }
}

fn pal(collection: u64, entries: Vec<PalEntry>) -> ObjectPal {
    ObjectPal { collection, pal: Pal::new(entries) }
}

fn whole() -> [Region; 1] {
    [rg(0, DATA.len() as u64)]
}

fn far_future() -> u64 {
    u64::MAX / 2
}

/// An identity credential made with identity key `k` (id `key_id`), as the
/// authentication server makes one.
fn identity(k: &Key, key_id: u32, user: u32, role: u32, expiration_ns: u64) -> Credential {
    let data = IdentityData { algorithm: MacAlgorithm::Blake3 as u8, key_id, user, role, expiration_ns };
    Credential::Identity { data, key: identity_key(k, &data).unwrap() }
}

/// A drive with identity key 1 installed, partition `P` accepting both
/// capabilities and identities, and one object holding `DATA` whose access
/// PAL lets ALICE read and role EDITORS read and write.
struct Dsfs {
    d: Drive,
    admin: DriveClient,
    k1: Key,
    object: u64,
}

impl Dsfs {
    async fn start() -> Dsfs {
        Self::start_with(Options::default()).await
    }

    async fn start_with(options: Options) -> Dsfs {
        Self::start_sharing(options, Key::random(), AuthScheme::BOTH).await
    }

    /// A drive whose identity key 1 is `k1` (the authentication server
    /// shares one with every drive) and whose partition `P` accepts `scheme`.
    async fn start_sharing(options: Options, k1: Key, scheme: AuthScheme) -> Dsfs {
        let d = Drive::start_with(options).await;
        let mut admin = d.admin().await;
        admin.set_identity_key(&d.drive_key, 1, &k1).await.unwrap();
        admin.set_auth_scheme(P, scheme).await.unwrap();
        let (object, _) = admin.create(P).await.unwrap();
        admin.write(P, object, &whole(), DATA).await.unwrap();
        admin.set_pal(P, object, &pal(0, vec![user(ALICE, R), role(EDITORS, RW)])).await.unwrap();
        Dsfs { d, admin, k1, object }
    }

    /// A client whose requests go under `credential` alone.
    async fn client(&self, credential: Credential) -> DriveClient {
        self.d.client(credential).await
    }

    async fn as_user(&self, user: u32, role: u32) -> DriveClient {
        self.client(identity(&self.k1, 1, user, role, far_future())).await
    }

    /// The object's bytes, read under the drive key.
    async fn bytes(&mut self) -> Vec<u8> {
        self.admin.read(P, self.object, &[rg(0, 4096)]).await.unwrap().1
    }

    /// Stops the drive gracefully and serves the same directory again.
    async fn restart(self) -> Dsfs {
        let Dsfs { mut d, admin, k1, object } = self;
        drop(admin);
        d.restart().await;
        let admin = d.admin().await;
        Dsfs { d, admin, k1, object }
    }

    /// Bytes charged to partition `P` (writes in progress included).
    async fn charged(&mut self) -> u64 {
        let info = self.admin.inquiry().await.unwrap();
        info.partitions.iter().find(|x| x.partition == P).expect("partition").used_bytes
    }

    /// Nothing changed, and ALICE still reads.
    async fn unchanged(&mut self) {
        assert_eq!(self.bytes().await, DATA, "the object changed");
        let mut alice = self.as_user(ALICE, NO_ROLE).await;
        assert_eq!(alice.read(P, self.object, &whole()).await.unwrap().1, DATA, "the honest path broke");
    }
}

// ------------------------------------------------------------------ raw frames

/// A request frame for the drive `drive_id` under `credential` (an
/// identity or a capability), with `data` unprotected after the digest:
/// exactly what a client sends.
fn raw_frame(credential: &Credential, drive_id: &[u8; 16], req: &Request, data: &[u8], nonce_seq: u64) -> Vec<u8> {
    let (key_type, field, key, alg) = match credential {
        Credential::Identity { data, key } => {
            let frame_key = identity_drive_key(key, data, drive_id).unwrap();
            (KeyType::Identity, data.encode().to_vec(), frame_key, MacAlgorithm::Blake3)
        }
        Credential::Capability { token, key, algorithm } => {
            (KeyType::Capability, token.clone(), key.clone(), *algorithm)
        }
        _ => panic!("identity or capability"),
    };
    let mut h = FrameHeader::request(req.opcode(), nonce_seq);
    h.key_type = key_type;
    h.protection = Protection::INTEGRITY_ARGS;
    h.nonce = nasd_proto::nonce(now_ns(), nonce_seq);
    h.data_len = data.len() as u64;
    h.chunk_len = if data.is_empty() { 0 } else { 512 };
    let mut bytes = FramePrefix::encode(&h, &field, &req.encode_args(), &[0; 32]);
    let split = bytes.len() - 32;
    let digest = FrameKeys::new(alg, &key).digest(h.protection, &bytes[..split]);
    bytes[split..].copy_from_slice(&digest);
    bytes.extend_from_slice(data);
    bytes
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// Reads one reply frame and returns its status (replies to these requests carry no data).
async fn reply_status(s: &mut TcpStream) -> Status {
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head).await.unwrap();
    let h = FrameHeader::decode(&head).unwrap();
    let mut body = vec![0u8; h.body_len()];
    s.read_exact(&mut body).await.unwrap();
    assert_eq!(h.data_len, 0);
    Status::from_code(h.status).unwrap()
}

async fn step<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f).await.expect("the drive answers in time")
}

// ------------------------------------------------------------------ the happy path

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_is_authorized_by_the_pals_without_a_capability() {
    let mut s = Dsfs::start().await;
    let o = s.object;
    // ALICE: read and getattr by her user entry; not write, not remove.
    let mut alice = s.as_user(ALICE, NO_ROLE).await;
    assert_eq!(alice.read(P, o, &whole()).await.unwrap().1, DATA);
    assert_eq!(alice.getattr(P, o).await.unwrap().logical_size, DATA.len() as u64);
    assert_eq!(refused(alice.write(P, o, &[rg(0, 3)], b"bad").await), Status::RightsInsufficient);
    assert_eq!(refused(alice.remove(P, o).await), Status::RightsInsufficient);
    // ALICE as an editor: her rights and the role's add up.
    let mut alice_editor = s.as_user(ALICE, EDITORS).await;
    alice_editor.write(P, o, &[rg(0, 3)], b"PRE").await.unwrap();
    assert_eq!(&s.bytes().await[..3], b"PRE");
    // BOB as an editor: the role alone.
    let mut bob = s.as_user(BOB, EDITORS).await;
    bob.write(P, o, &[rg(0, 3)], b"pre").await.unwrap();
    assert_eq!(s.bytes().await, DATA);

    // A collection's super PAL adds to every member's access PAL.
    let (o2, _) = s.admin.create(P).await.unwrap();
    s.admin.write(P, o2, &[rg(0, 2)], b"o2").await.unwrap();
    s.admin.set_pal(P, o2, &pal(COLLECTION, vec![])).await.unwrap();
    let mut reader = s.as_user(BOB, READERS).await;
    assert_eq!(refused(reader.read(P, o2, &[rg(0, 2)]).await), Status::NotInPal, "no super PAL yet");
    s.admin.set_super_pal(P, COLLECTION, &Pal::new(vec![role(READERS, R)])).await.unwrap();
    assert_eq!(reader.read(P, o2, &[rg(0, 2)]).await.unwrap().1, b"o2");
    assert_eq!(refused(reader.read(P, o, &whole()).await), Status::NotInPal, "o is not a member");
    assert_eq!(s.admin.get_super_pal(P, COLLECTION).await.unwrap(), Pal::new(vec![role(READERS, R)]));
    assert_eq!(s.admin.get_pal(P, o2).await.unwrap(), pal(COLLECTION, vec![]));
    assert_eq!(s.admin.get_pal(P, o).await.unwrap(), pal(0, vec![user(ALICE, R), role(EDITORS, RW)]));

    // A clone shares its source's PALs; a new object has none.
    let mut copier = s.as_user(ALICE, NO_ROLE).await;
    assert_eq!(refused(copier.fastcopy(P, o).await), Status::RightsInsufficient);
    s.admin.set_pal(P, o, &pal(0, vec![user(ALICE, R | rights::FASTCOPY)])).await.unwrap();
    let (clone, _) = copier.fastcopy(P, o).await.unwrap();
    assert_eq!(copier.read(P, clone, &whole()).await.unwrap().1, DATA);
    let (fresh, _) = s.admin.create(P).await.unwrap();
    assert_eq!(refused(copier.getattr(P, fresh).await), Status::NotInPal);
    // An identity does not create objects: the manager does.
    assert_eq!(refused(copier.create(P).await), Status::WrongKeyType);

    // The drive audits requests by identity with user and role as the audit id.
    let records = s.admin.read_audit(&s.d.drive_key, 0, 512).await.unwrap();
    assert!(
        records.iter().any(|r| r.key_type == KeyType::Identity as u8
            && r.audit_id == (BOB as u64) << 32 | READERS as u64
            && r.object == o2
            && r.status == 0),
        "the identity's read of o2 is in the audit trail"
    );
}

// ------------------------------------------------------------------ attacks

/// K_data is bound to the identity key: any field changed — or a key
/// that is not the one the authentication server made — fails the digest
/// (`BAD_DIGEST`), before any PAL is consulted; malformed credentials are
/// `BAD_CAPABILITY`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_or_tampered_identity_credentials_are_refused() {
    let mut s = Dsfs::start().await;
    let o = s.object;
    let Credential::Identity { data: honest, key } = identity(&s.k1, 1, MALLORY, NO_ROLE, far_future()) else {
        unreachable!()
    };
    // MALLORY holds a genuine identity (not in the PAL) and edits her credential.
    let tampered = [
        ("user claims ALICE", IdentityData { user: ALICE, ..honest }),
        ("role claims EDITORS", IdentityData { role: EDITORS, ..honest }),
        ("expiration pushed", IdentityData { expiration_ns: honest.expiration_ns + 1, ..honest }),
        ("algorithm switched", IdentityData { algorithm: MacAlgorithm::HmacSha256 as u8, ..honest }),
    ];
    for (case, data) in tampered {
        let mut c = s.client(Credential::Identity { data, key: key.clone() }).await;
        assert_eq!(refused(c.write(P, o, &[rg(0, 3)], b"bad").await), Status::BadDigest, "{case}");
        assert_eq!(refused(c.read(P, o, &whole()).await), Status::BadDigest, "{case}");
    }
    // A credential for ALICE with a key the authentication server never made.
    let forged = IdentityData { user: ALICE, role: EDITORS, ..honest };
    let mut c = s.client(Credential::Identity { data: forged, key: Key::random() }).await;
    assert_eq!(refused(c.write(P, o, &[rg(0, 3)], b"bad").await), Status::BadDigest);
    // A key made with another identity key K under the right key id.
    let other_k = Key::random();
    let mut c = s.client(identity(&other_k, 1, ALICE, EDITORS, far_future())).await;
    assert_eq!(refused(c.read(P, o, &whole()).await), Status::BadDigest);
    // A bit flipped anywhere in the credential on the wire.
    let honest_frame = raw_frame(
        &Credential::Identity { data: forged, key: identity_key(&s.k1, &forged).unwrap() },
        &s.admin.drive_id(),
        &Request::GetAttr { partition: P, object: o },
        &[],
        1,
    );
    let mut sock = TcpStream::connect(s.d.addr).await.unwrap();
    for byte in 0..IDENTITY_DATA_LEN {
        for bit in [0x01u8, 0x80] {
            let mut f = honest_frame.clone();
            f[HEADER_LEN + byte] ^= bit;
            sock.write_all(&f).await.unwrap();
            let status = step(reply_status(&mut sock)).await;
            assert!(
                matches!(status, Status::BadDigest | Status::BadCapability | Status::KeyNotSet),
                "byte {byte} bit {bit:#x}: {status}"
            );
        }
    }
    // Malformed credentials: refused before any key is looked up.
    let mut bad_len =
        raw_frame(&identity(&s.k1, 1, ALICE, NO_ROLE, far_future()), &s.admin.drive_id(), &Request::Inquiry, &[], 2);
    bad_len.insert(HEADER_LEN, 0); // one byte more than the header's capability_len says: fix the header
    let mut h = FrameHeader::decode(bad_len[..HEADER_LEN].try_into().unwrap()).unwrap();
    h.capability_len += 1;
    bad_len[..HEADER_LEN].copy_from_slice(&h.encode());
    sock.write_all(&bad_len).await.unwrap();
    assert_eq!(step(reply_status(&mut sock)).await, Status::BadCapability, "a 25-byte credential");
    s.unchanged().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_identity_is_refused() {
    let mut s = Dsfs::start().await;
    let o = s.object;
    let past = now_ns() - 1_000_000_000;
    let mut expired = s.client(identity(&s.k1, 1, ALICE, EDITORS, past)).await;
    let e = expired.write(P, o, &[rg(0, 3)], b"bad").await.unwrap_err();
    assert_eq!(e.status(), Some(Status::IdentityExpired), "{e}");
    assert!(e.to_string().contains("authentication server"), "{e}");
    assert_eq!(refused(expired.read(P, o, &whole()).await), Status::IdentityExpired);
    // The refusal is protected (the request proved the key): the client
    // believed it and the connection goes on.
    assert!(!matches!(expired.read(P, o, &whole()).await, Err(ClientError::Broken)));
    let mut fresh = s.client(identity(&s.k1, 1, ALICE, EDITORS, now_ns() + 3_600_000_000_000)).await;
    fresh.write(P, o, &[rg(0, 3)], b"pre").await.unwrap();
    s.unchanged().await;
}

/// Several identity keys live at once; retiring one revokes every identity
/// key made with it and leaves the others valid; key ids only grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_key_id_revokes_its_identities_only() {
    let mut s = Dsfs::start().await;
    let o = s.object;
    let k2 = Key::random();
    s.admin.set_identity_key(&s.d.drive_key, 2, &k2).await.unwrap();
    let mut under1 = s.client(identity(&s.k1, 1, ALICE, NO_ROLE, far_future())).await;
    let mut under2 = s.client(identity(&k2, 2, ALICE, NO_ROLE, far_future())).await;
    assert_eq!(under1.read(P, o, &whole()).await.unwrap().1, DATA);
    assert_eq!(under2.read(P, o, &whole()).await.unwrap().1, DATA);

    s.admin.retire_identity_key(&s.d.drive_key, 1).await.unwrap();
    let e = under1.read(P, o, &whole()).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::KeyVersionRetired), "{e}");
    assert!(e.to_string().contains("identity key 1 is retired"), "{e}");
    assert_eq!(under2.read(P, o, &whole()).await.unwrap().1, DATA, "key 2's identities stay valid");
    // Retiring again changes nothing; an id never installed cannot be retired.
    s.admin.retire_identity_key(&s.d.drive_key, 1).await.unwrap();
    assert_eq!(refused(s.admin.retire_identity_key(&s.d.drive_key, 9).await), Status::BadArguments);
    // A retired id cannot come back, not even with the same key.
    assert_eq!(refused(s.admin.set_identity_key(&s.d.drive_key, 1, &s.k1).await), Status::BadArguments);
    assert_eq!(refused(under1.read(P, o, &whole()).await), Status::KeyVersionRetired);
    // An id above every installed one is simply unknown.
    let mut under3 = s.client(identity(&s.k1, 3, ALICE, NO_ROLE, far_future())).await;
    assert_eq!(refused(under3.read(P, o, &whole()).await), Status::KeyNotSet);

    // Only the drive key installs and retires identity keys.
    let cap = s.d.capability(s.admin.drive_id(), 0);
    let mut capable = s.client(cap).await;
    let req = Request::RetireIdentityKey { key_id: 2 };
    assert_eq!(refused(capable.call(&req).await), Status::WrongKeyType);
    let mut partition_owner =
        s.client(Credential::Partition { partition: P, key: s.d.partition_keys[0].clone() }).await;
    assert_eq!(refused(partition_owner.call(&req).await), Status::WrongKeyType);
    assert_eq!(refused(under2.call(&req).await), Status::WrongKeyType);
    // At most IDENTITY_KEYS_MAX live at once.
    for id in 3..=(nasd_proto::limits::IDENTITY_KEYS_MAX as u32 + 1) {
        s.admin.set_identity_key(&s.d.drive_key, id, &Key::random()).await.unwrap();
    }
    let over = nasd_proto::limits::IDENTITY_KEYS_MAX as u32 + 2;
    assert_eq!(refused(s.admin.set_identity_key(&s.d.drive_key, over, &Key::random()).await), Status::TooMany);

    // Retirement and keys survive a restart.
    drop((under1, under2, under3, capable, partition_owner));
    let drive_key = s.d.drive_key.clone();
    let mut s = s.restart().await;
    let mut under1 = s.client(identity(&s.k1, 1, ALICE, NO_ROLE, far_future())).await;
    assert_eq!(refused(under1.read(P, o, &whole()).await), Status::KeyVersionRetired);
    let mut under2 = s.client(identity(&k2, 2, ALICE, NO_ROLE, far_future())).await;
    assert_eq!(under2.read(P, o, &whole()).await.unwrap().1, DATA);
    assert_eq!(refused(s.admin.set_identity_key(&drive_key, 2, &k2).await), Status::BadArguments);
    assert_eq!(s.bytes().await, DATA);
}

/// A credential's role is what it claims, bound by the identity key; a role
/// the PAL does not name, a user it does not name, or no role at all grant
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_roles_absent_from_the_pal_are_refused() {
    let mut s = Dsfs::start().await;
    let o = s.object;
    // BOB holds a genuine identity for role READERS: the PAL names EDITORS only.
    let mut bob_reader = s.as_user(BOB, READERS).await;
    let e = bob_reader.write(P, o, &[rg(0, 3)], b"bad").await.unwrap_err();
    assert_eq!(e.status(), Some(Status::NotInPal), "{e}");
    assert_eq!(refused(bob_reader.read(P, o, &whole()).await), Status::NotInPal);
    // BOB without a role, MALLORY with none or with an unrelated role.
    for (u, r) in [(BOB, NO_ROLE), (MALLORY, NO_ROLE), (MALLORY, 12345)] {
        let mut c = s.as_user(u, r).await;
        assert_eq!(refused(c.read(P, o, &whole()).await), Status::NotInPal, "user {u} role {r}");
        assert_eq!(refused(c.getattr(P, o).await), Status::NotInPal, "user {u} role {r}");
        assert_eq!(refused(c.remove(P, o).await), Status::NotInPal, "user {u} role {r}");
    }
    // A user entry does not match a role of the same number, nor the reverse.
    s.admin.set_pal(P, o, &pal(0, vec![user(EDITORS, R), role(ALICE, R)])).await.unwrap();
    let mut confused = s.as_user(MALLORY, EDITORS).await;
    assert_eq!(refused(confused.read(P, o, &whole()).await), Status::NotInPal);
    let mut alice = s.as_user(ALICE, NO_ROLE).await;
    assert_eq!(refused(alice.read(P, o, &whole()).await), Status::NotInPal);
    // A role with READ only does not write.
    s.admin.set_pal(P, o, &pal(0, vec![role(EDITORS, R)])).await.unwrap();
    let mut editor = s.as_user(BOB, EDITORS).await;
    assert_eq!(refused(editor.write(P, o, &[rg(0, 3)], b"bad").await), Status::RightsInsufficient);
    assert_eq!(
        refused(editor.setattr(P, o, nasd_proto::AttrMask::FS_SPECIFIC, &Default::default()).await),
        Status::RightsInsufficient
    );
    // Control objects have no PAL.
    assert_eq!(
        refused(editor.read(P, nasd_proto::well_known::PARTITION_CONTROL, &[rg(0, 36)]).await),
        Status::NotInPal
    );
    s.admin.set_pal(P, o, &pal(0, vec![user(ALICE, R), role(EDITORS, RW)])).await.unwrap();
    s.unchanged().await;
}

/// Replacing an object's PAL, its collection membership or its collection's
/// super PAL takes effect the moment the set returns — including for a
/// write whose data is still arriving — and is durable at that moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_pal_is_enforced_the_moment_the_set_returns() {
    let mut s = Dsfs::start().await;
    let o = s.object;
    let mut alice = s.as_user(ALICE, NO_ROLE).await;
    assert_eq!(alice.read(P, o, &whole()).await.unwrap().1, DATA);
    s.admin.set_pal(P, o, &pal(0, vec![role(EDITORS, RW)])).await.unwrap();
    assert_eq!(refused(alice.read(P, o, &whole()).await), Status::NotInPal, "access PAL replaced");

    // Through the collection: membership, then the super PAL.
    s.admin.set_super_pal(P, COLLECTION, &Pal::new(vec![user(ALICE, R)])).await.unwrap();
    s.admin.set_pal(P, o, &pal(COLLECTION, vec![role(EDITORS, RW)])).await.unwrap();
    assert_eq!(alice.read(P, o, &whole()).await.unwrap().1, DATA, "member of the collection");
    s.admin.set_super_pal(P, COLLECTION, &Pal::new(vec![user(BOB, R)])).await.unwrap();
    assert_eq!(refused(alice.read(P, o, &whole()).await), Status::NotInPal, "super PAL replaced");
    s.admin.set_super_pal(P, COLLECTION, &Pal::new(vec![user(ALICE, R)])).await.unwrap();
    assert_eq!(alice.read(P, o, &whole()).await.unwrap().1, DATA);
    s.admin.set_pal(P, o, &pal(0, vec![role(EDITORS, RW)])).await.unwrap();
    assert_eq!(refused(alice.read(P, o, &whole()).await), Status::NotInPal, "left the collection");
    s.admin.set_super_pal(P, COLLECTION, &Pal::default()).await.unwrap();
    assert_eq!(s.admin.get_super_pal(P, COLLECTION).await.unwrap(), Pal::default(), "an empty list removes it");

    // A write by an editor whose data is held back while the PAL changes:
    // its first chunk arrives, the editors lose the object, then the rest
    // arrives — the write installs nothing.
    for change in ["access PAL", "membership", "super PAL"] {
        match change {
            "access PAL" => s.admin.set_pal(P, o, &pal(0, vec![role(EDITORS, RW)])).await.unwrap(),
            _ => {
                s.admin.set_super_pal(P, COLLECTION, &Pal::new(vec![role(EDITORS, RW)])).await.unwrap();
                s.admin.set_pal(P, o, &pal(COLLECTION, vec![])).await.unwrap();
            }
        }
        let editor = identity(&s.k1, 1, BOB, EDITORS, far_future());
        let new = vec![b'X'; 1024];
        // Into a hole: the write needs a new block, which the store charges when it plans.
        let frame = raw_frame(
            &editor,
            &s.admin.drive_id(),
            &Request::Write { partition: P, object: o, regions: vec![rg(8192, 1024)] },
            &new,
            100,
        );
        let (first, rest) = frame.split_at(frame.len() - 512);
        let base = s.charged().await;
        let mut sock = TcpStream::connect(s.d.addr).await.unwrap();
        sock.write_all(first).await.unwrap();
        // The first chunk is in the store task, which planned the write (a
        // new block charged): authorized under the old PALs, not installed.
        step(async {
            while s.charged().await == base {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        match change {
            "access PAL" => s.admin.set_pal(P, o, &pal(0, vec![user(ALICE, R)])).await.unwrap(),
            "membership" => s.admin.set_pal(P, o, &pal(0, vec![user(ALICE, R)])).await.unwrap(),
            _ => s.admin.set_super_pal(P, COLLECTION, &Pal::new(vec![user(ALICE, R)])).await.unwrap(),
        }
        sock.write_all(rest).await.unwrap();
        assert_eq!(step(reply_status(&mut sock)).await, Status::AccessRevoked, "{change} changed mid-write");
        assert_eq!(s.bytes().await, DATA, "{change}: the write changed nothing");
        s.admin.set_pal(P, o, &pal(0, vec![user(ALICE, R), role(EDITORS, RW)])).await.unwrap();
    }
    s.unchanged().await;
}

/// A PAL set is durable when it returns: a drive that stops without its
/// final commit (a crash) comes back with it — the object's access PAL, and
/// a collection's super PAL, each set last before the crash.
#[test]
fn a_pal_set_is_durable_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let master = Key::random();
    let drive_key = Key::random();
    let k1 = Key::random();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = |addr, credential: Credential| async move {
        let mut c = DriveClient::connect(addr).await.unwrap();
        c.set_auth(Auth::new(credential, PROTECTION));
        c
    };
    let as_user = |user, role| identity(&k1, 1, user, role, far_future());
    let drive = CrashableDrive::start(dir.path(), &master);
    let object = rt.block_on(async {
        let mut c = DriveClient::connect(drive.addr).await.unwrap();
        c.set_drive_key(&master, &drive_key).await.unwrap();
        c.set_auth(Auth::new(Credential::Drive(drive_key.clone()), PROTECTION));
        c.create_partition(P).await.unwrap();
        c.resize_partition(P, 16 << 20).await.unwrap();
        c.set_identity_key(&drive_key, 1, &k1).await.unwrap();
        c.set_auth_scheme(P, AuthScheme::PALS).await.unwrap();
        let (o, _) = c.create(P).await.unwrap();
        c.write(P, o, &whole(), DATA).await.unwrap();
        c.set_super_pal(P, COLLECTION, &Pal::new(vec![role(EDITORS, RW)])).await.unwrap();
        c.flush(P, &[o]).await.unwrap();
        // The last change before the crash: the object's PAL.
        c.set_pal(P, o, &pal(COLLECTION, vec![user(ALICE, R)])).await.unwrap();
        o
    });
    drive.crash();
    let drive = CrashableDrive::start(dir.path(), &master);
    rt.block_on(async {
        let mut alice = client(drive.addr, as_user(ALICE, NO_ROLE)).await;
        assert_eq!(alice.read(P, object, &whole()).await.unwrap().1, DATA, "the access PAL survived");
        let mut editor = client(drive.addr, as_user(BOB, EDITORS)).await;
        editor.write(P, object, &[rg(0, 3)], b"pre").await.unwrap();
        let mut bob = client(drive.addr, as_user(BOB, NO_ROLE)).await;
        assert_eq!(refused(bob.read(P, object, &whole()).await), Status::NotInPal);
        // The last change before the next crash: the super PAL.
        let mut admin = client(drive.addr, Credential::Drive(drive_key.clone())).await;
        admin.set_super_pal(P, COLLECTION, &Pal::new(vec![role(READERS, R)])).await.unwrap();
    });
    drive.crash();
    let drive = CrashableDrive::start(dir.path(), &master);
    rt.block_on(async {
        let mut editor = client(drive.addr, as_user(BOB, EDITORS)).await;
        assert_eq!(refused(editor.read(P, object, &whole()).await), Status::NotInPal, "the new super PAL survived");
        let mut reader = client(drive.addr, as_user(BOB, READERS)).await;
        assert_eq!(reader.read(P, object, &whole()).await.unwrap().1, DATA);
    });
    drive.crash();
}

/// A drive served on a runtime of its own, so that it can be stopped
/// without its final commit: what it answered before is on disk only if
/// it was made durable before the answer.
struct CrashableDrive {
    addr: std::net::SocketAddr,
    crash: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl CrashableDrive {
    fn start(dir: &std::path::Path, master: &Key) -> CrashableDrive {
        let (dir, master) = (dir.to_path_buf(), master.clone());
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (crash, crashed) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
            rt.block_on(async move {
                // The previous instance's store closes once its blocking tasks end.
                let opts = StoreOptions { block_size: 4096, capacity_bytes: 64 << 20, ..StoreOptions::default() };
                let store = loop {
                    match Store::open(&dir, &opts) {
                        Ok(s) => break Arc::new(s),
                        Err(nasd_store::StoreError::Locked(_)) => tokio::time::sleep(Duration::from_millis(5)).await,
                        Err(e) => panic!("{e}"),
                    }
                };
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                let config = DriveConfig {
                    commit_interval: Duration::from_secs(3600),
                    security: SecurityMode::Enforced { master_key: Some(master) },
                    ..DriveConfig::default()
                };
                tokio::select! {
                    served = nasd_drive::serve(listener, store, config, std::future::pending()) => served.unwrap(),
                    _ = crashed => {} // dropped here: no final commit
                }
            });
            rt.shutdown_timeout(Duration::from_secs(20));
        });
        let addr = addr_rx.recv_timeout(Duration::from_secs(20)).expect("the drive starts");
        CrashableDrive { addr, crash, thread }
    }

    fn crash(self) {
        let _ = self.crash.send(());
        self.thread.join().unwrap();
    }
}

/// A PAL longer than `PAL_ENTRIES_MAX` is refused with `PAL_OVERFLOW`
/// (the manager's cue to fold users into a role), and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overflowing_pal_is_refused_and_changes_nothing() {
    let mut s = Dsfs::start().await;
    let o = s.object;
    let before = s.admin.get_pal(P, o).await.unwrap();
    let many = |n: u32| (0..n).map(|i| user(20_000 + i, R)).collect::<Vec<_>>();
    let e = s.admin.set_pal(P, o, &pal(0, many(PAL_ENTRIES_MAX as u32 + 1))).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::PalOverflow), "{e}");
    assert_eq!(s.admin.get_pal(P, o).await.unwrap(), before, "the old PAL stays");
    assert_eq!(
        refused(s.admin.set_super_pal(P, COLLECTION, &Pal::new(many(PAL_ENTRIES_MAX as u32 + 1))).await),
        Status::PalOverflow
    );
    assert_eq!(s.admin.get_super_pal(P, COLLECTION).await.unwrap(), Pal::default());
    // Exactly PAL_ENTRIES_MAX entries fit; the last one is matched like the first.
    let mut full = many(PAL_ENTRIES_MAX as u32 - 1);
    full.push(user(ALICE, R));
    s.admin.set_pal(P, o, &pal(0, full.clone())).await.unwrap();
    assert_eq!(s.admin.get_pal(P, o).await.unwrap(), pal(0, full));
    let mut alice = s.as_user(ALICE, NO_ROLE).await;
    assert_eq!(alice.read(P, o, &whole()).await.unwrap().1, DATA);
    // Entries the decoder refuses: a role 0, no rights, the CREATE right.
    for bad in [vec![role(0, R)], vec![user(ALICE, 0)], vec![user(ALICE, rights::CREATE)]] {
        assert_eq!(refused(s.admin.set_pal(P, o, &pal(0, bad)).await), Status::BadArguments);
    }
    assert_eq!(refused(s.admin.set_super_pal(P, 0, &Pal::new(vec![user(ALICE, R)])).await), Status::BadArguments);
    s.unchanged().await;
}

/// A request by identity, replayed to the same drive: the drive's nonce
/// cache refuses it, so a captured write does not land twice there (other
/// drives refuse it by its digest:
/// `requests_captured_on_one_drive_are_refused_by_every_other_drive`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_identity_request_is_refused() {
    let mut s = Dsfs::start().await;
    let o = s.object;
    let editor = identity(&s.k1, 1, BOB, EDITORS, far_future());
    let id = s.admin.drive_id();
    let write =
        raw_frame(&editor, &id, &Request::Write { partition: P, object: o, regions: vec![rg(0, 3)] }, b"AAA", 7);
    let mut sock = TcpStream::connect(s.d.addr).await.unwrap();
    sock.write_all(&write).await.unwrap();
    assert_eq!(step(reply_status(&mut sock)).await, Status::Ok);
    assert_eq!(&s.bytes().await[..3], b"AAA");
    s.admin.write(P, o, &[rg(0, 3)], b"pre").await.unwrap();
    // The same bytes again, on the same connection and on a new one.
    sock.write_all(&write).await.unwrap();
    assert_eq!(step(reply_status(&mut sock)).await, Status::NonceReplayed);
    let mut other = TcpStream::connect(s.d.addr).await.unwrap();
    other.write_all(&write).await.unwrap();
    assert_eq!(step(reply_status(&mut other)).await, Status::NonceReplayed);
    // A captured read replays no better.
    let read = raw_frame(&editor, &id, &Request::GetAttr { partition: P, object: o }, &[], 8);
    sock.write_all(&read).await.unwrap();
    assert_eq!(step(reply_status(&mut sock)).await, Status::Ok);
    sock.write_all(&read).await.unwrap();
    assert_eq!(step(reply_status(&mut sock)).await, Status::NonceReplayed);
    s.unchanged().await;
}

/// Every object request a user may send, each changing or revealing the
/// object `o` of partition `P` (with `data` for a write).
fn object_requests(o: u64) -> Vec<(&'static str, Request, Vec<u8>)> {
    let truncate = AttrMask::LOGICAL_SIZE;
    vec![
        ("READ", Request::Read { partition: P, object: o, regions: vec![rg(0, DATA.len() as u64)] }, vec![]),
        ("GETATTR", Request::GetAttr { partition: P, object: o }, vec![]),
        ("BLOCKS_REQUIRED", Request::BlocksRequired { partition: P, object: o, regions: vec![rg(0, 4096)] }, vec![]),
        ("EXTENTS", Request::Extents { partition: P, object: o, offset: 0, max: 16 }, vec![]),
        ("WRITE", Request::Write { partition: P, object: o, regions: vec![rg(0, 8)] }, b"REPLAYED".to_vec()),
        (
            "SETATTR",
            Request::SetAttr {
                partition: P,
                object: o,
                mask: truncate,
                attrs: Attributes { logical_size: 1, ..Attributes::default() },
            },
            vec![],
        ),
        ("FASTCOPY", Request::FastCopy { partition: P, source: o }, vec![]),
        ("FLUSH", Request::Flush { partition: P, objects: vec![o] }, vec![]),
        ("REMOVE", Request::Remove { partition: P, object: o }, vec![]),
    ]
}

/// Sends `frame` on a new connection and returns the reply's status (the
/// reply's data, if any, is left unread: the connection is dropped).
async fn send_once(addr: std::net::SocketAddr, frame: &[u8]) -> Status {
    let mut sock = TcpStream::connect(addr).await.unwrap();
    sock.write_all(frame).await.unwrap();
    let mut head = [0u8; HEADER_LEN];
    step(sock.read_exact(&mut head)).await.unwrap();
    Status::from_code(FrameHeader::decode(&head).unwrap().status).unwrap()
}

/// Issue 22: DSFS shares one identity key K with every drive, object
/// numbers repeat across drives, and each drive's replay cache knows only
/// its own requests. A man in the middle with no key captures a request on
/// one drive and replays it, unchanged, to every other drive where the same
/// user may do the same to the same object number: each refuses it (an
/// identity's frame key is bound to the drive, a capability's keys are the
/// drive's own), before and after the original lands, and nothing there
/// changes — on a PALs-only partition and on one that takes both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_captured_on_one_drive_are_refused_by_every_other_drive() {
    for scheme in [AuthScheme::PALS, AuthScheme::BOTH] {
        for kind in ["identity", "capability"] {
            if kind == "capability" && !scheme.capabilities() {
                continue;
            }
            let k1 = Key::random();
            let mut drives = Vec::new();
            for _ in 0..3 {
                drives.push(Dsfs::start_sharing(Options::default(), k1.clone(), scheme).await);
            }
            let o = drives[0].object;
            assert!(drives.iter().all(|d| d.object == o), "fresh drives number their first object alike");
            let every_right = pal(0, vec![user(ALICE, R), role(EDITORS, nasd_proto::PAL_RIGHTS)]);
            for d in &mut drives {
                d.admin.set_pal(P, o, &every_right).await.unwrap();
            }
            let source = drives[0].admin.drive_id();
            let credential = match kind {
                "identity" => identity(&k1, 1, BOB, EDITORS, far_future()),
                _ => drives[0].d.capability(source, o),
            };
            for (seq, (name, req, data)) in object_requests(o).into_iter().enumerate() {
                let frame = raw_frame(&credential, &source, &req, &data, 1000 + seq as u64);
                for when in ["before it reached drive 0", "after drive 0 ran it"] {
                    if when.starts_with("after") {
                        // The frame was good where it was meant to go.
                        let status = send_once(drives[0].d.addr, &frame).await;
                        assert_eq!(status, Status::Ok, "{scheme:?}: {name} under the {kind} on drive 0");
                    }
                    for (i, d) in drives.iter().enumerate().skip(1) {
                        assert_eq!(
                            send_once(d.d.addr, &frame).await,
                            Status::BadDigest,
                            "{scheme:?}: {name} under the {kind} for drive 0, replayed to drive {i} {when}"
                        );
                    }
                }
            }
            for d in &mut drives[1..] {
                d.unchanged().await;
                assert_eq!(d.admin.getattr(P, o).await.unwrap().logical_size, DATA.len() as u64);
            }
        }
    }
}

/// The partition's scheme: capabilities only (the default), PALs only, or
/// both; a credential of the kind it does not accept is refused with
/// `AUTH_SCHEME_REFUSED`; the owner's keys work under every scheme.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_partition_scheme_refuses_the_other_kind() {
    let mut s = Dsfs::start().await;
    let o = s.object;
    let drive_id = s.admin.drive_id();
    let mut cap = s.client(s.d.capability(drive_id, o)).await;
    let mut alice = s.as_user(ALICE, NO_ROLE).await;
    let mut working = s.client(Credential::Working { partition: P, key_version: 1, key: s.d.working.clone() }).await;

    s.admin.set_auth_scheme(P, AuthScheme::CAPABILITIES).await.unwrap();
    assert_eq!(refused(alice.read(P, o, &whole()).await), Status::AuthSchemeRefused);
    assert_eq!(cap.read(P, o, &whole()).await.unwrap().1, DATA);

    s.admin.set_auth_scheme(P, AuthScheme::PALS).await.unwrap();
    let e = cap.read(P, o, &whole()).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::AuthSchemeRefused), "{e}");
    assert_eq!(refused(cap.write(P, o, &[rg(0, 3)], b"bad").await), Status::AuthSchemeRefused);
    assert_eq!(alice.read(P, o, &whole()).await.unwrap().1, DATA);

    s.admin.set_auth_scheme(P, AuthScheme::BOTH).await.unwrap();
    assert_eq!(cap.read(P, o, &whole()).await.unwrap().1, DATA);
    assert_eq!(alice.read(P, o, &whole()).await.unwrap().1, DATA);
    for scheme in [AuthScheme::CAPABILITIES, AuthScheme::PALS, AuthScheme::BOTH] {
        s.admin.set_auth_scheme(P, scheme).await.unwrap();
        assert_eq!(working.read(P, o, &whole()).await.unwrap().1, DATA, "the owner's key under {scheme:?}");
        assert_eq!(alice.auth_scheme(P).await.unwrap(), scheme, "anyone may ask");
    }
    // Another partition keeps the default: capabilities only.
    assert_eq!(alice.auth_scheme(OTHER).await.unwrap(), AuthScheme::CAPABILITIES);

    // Only the drive key or the partition's key sets it; bad values change nothing.
    let req = Request::SetAuthScheme { partition: P, scheme: AuthScheme::CAPABILITIES };
    assert_eq!(refused(cap.call(&req).await), Status::WrongKeyType);
    assert_eq!(refused(alice.call(&req).await), Status::WrongKeyType);
    assert_eq!(refused(working.call(&req).await), Status::WrongKeyType);
    let mut other_owner =
        s.client(Credential::Partition { partition: OTHER, key: s.d.partition_keys[1].clone() }).await;
    assert_eq!(refused(other_owner.call(&req).await), Status::WrongObject);
    let mut owner = s.client(Credential::Partition { partition: P, key: s.d.partition_keys[0].clone() }).await;
    owner.set_auth_scheme(P, AuthScheme::PALS).await.unwrap();
    assert_eq!(refused(s.admin.set_auth_scheme(0, AuthScheme::PALS).await), Status::BadArguments);

    // Durable: the scheme survives a restart.
    drop((cap, alice, working, other_owner, owner));
    let mut s = s.restart().await;
    let mut cap = s.client(s.d.capability(drive_id, o)).await;
    assert_eq!(refused(cap.read(P, o, &whole()).await), Status::AuthSchemeRefused);
    s.admin.set_auth_scheme(P, AuthScheme::BOTH).await.unwrap();
    s.unchanged().await;
}

/// PALs are the manager's decisions: set and read only with the owner's
/// keys (drive key; partition or working key of the object's partition),
/// never with a capability or an identity, whatever rights they hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_sets_and_reads_pals() {
    let mut s = Dsfs::start().await;
    let o = s.object;
    let everything = pal(0, vec![user(MALLORY, nasd_proto::PAL_RIGHTS)]);
    let mut cap_all = s.client(s.d.capability(s.admin.drive_id(), o)).await;
    let mut editor = s.as_user(BOB, EDITORS).await;
    s.admin.set_pal(P, o, &pal(0, vec![role(EDITORS, nasd_proto::PAL_RIGHTS)])).await.unwrap();
    for (who, c) in [("capability with every right", &mut cap_all), ("identity with every right", &mut editor)] {
        assert_eq!(refused(c.set_pal(P, o, &everything).await), Status::WrongKeyType, "{who}");
        assert_eq!(refused(c.get_pal(P, o).await), Status::WrongKeyType, "{who}");
        let super_pal = Pal::new(vec![user(MALLORY, R)]);
        assert_eq!(refused(c.set_super_pal(P, COLLECTION, &super_pal).await), Status::WrongKeyType, "{who}");
        assert_eq!(refused(c.get_super_pal(P, COLLECTION).await), Status::WrongKeyType, "{who}");
    }
    let mut other_working =
        s.client(Credential::Partition { partition: OTHER, key: s.d.partition_keys[1].clone() }).await;
    assert_eq!(refused(other_working.set_pal(P, o, &everything).await), Status::WrongObject);
    // The working key may set an object's PAL (not a super PAL).
    let mut working = s.client(Credential::Working { partition: P, key_version: 1, key: s.d.working.clone() }).await;
    working.set_pal(P, o, &pal(0, vec![user(ALICE, R)])).await.unwrap();
    assert_eq!(working.get_pal(P, o).await.unwrap(), pal(0, vec![user(ALICE, R)]));
    assert_eq!(
        refused(working.set_super_pal(P, COLLECTION, &Pal::new(vec![user(ALICE, R)])).await),
        Status::WrongKeyType
    );
    // Control objects get none; a missing object is named.
    assert_eq!(
        refused(s.admin.set_pal(P, nasd_proto::well_known::DRIVE_CONTROL, &everything).await),
        Status::ReadOnlyObject
    );
    assert_eq!(refused(s.admin.set_pal(P, o + 100, &everything).await), Status::NoSuchObject);
    assert_eq!(
        refused(s.admin.set_super_pal(P + 100, COLLECTION, &Pal::new(vec![user(1, R)])).await),
        Status::NoSuchPartition
    );
    let mut mallory = s.as_user(MALLORY, NO_ROLE).await;
    assert_eq!(refused(mallory.read(P, o, &whole()).await), Status::NotInPal);
    s.admin.set_pal(P, o, &pal(0, vec![user(ALICE, R), role(EDITORS, RW)])).await.unwrap();
    s.unchanged().await;
}

/// A client holding both a capability and an identity sends each request
/// under the one the partition accepts, without its caller noticing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_both_credentials_follows_the_partition_scheme() {
    let mut s = Dsfs::start().await;
    let o = s.object;
    let drive_id = s.admin.drive_id();
    // A capability for reads only, and ALICE's identity (read by PAL).
    let mut args = Drive::capability_args(drive_id, o);
    args.rights = R;
    let mut both = s.client(Drive::mint(&s.d.working, &args)).await;
    both.set_identity(Some(Auth::new(identity(&s.k1, 1, ALICE, NO_ROLE, far_future()), PROTECTION)));

    for scheme in [AuthScheme::CAPABILITIES, AuthScheme::PALS, AuthScheme::BOTH, AuthScheme::CAPABILITIES] {
        // The scheme changes under the client: it learns from the drive's
        // authenticated refusal and sends the request again under the other credential.
        s.admin.set_auth_scheme(P, scheme).await.unwrap();
        assert_eq!(both.read(P, o, &whole()).await.unwrap().1, DATA, "{scheme:?}");
        assert_eq!(both.getattr(P, o).await.unwrap().logical_size, DATA.len() as u64, "{scheme:?}");
        let expect = if scheme.pals() { AuthScheme::PALS } else { AuthScheme::CAPABILITIES };
        assert!(both.known_scheme(P).is_some_and(|k| k.pals() == expect.pals()), "{scheme:?}");
    }
    // Which credential went: ALICE's PAL allows what the capability does not, and the reverse.
    s.admin.set_auth_scheme(P, AuthScheme::PALS).await.unwrap();
    s.admin.set_pal(P, o, &pal(0, vec![user(ALICE, RW)])).await.unwrap();
    both.write(P, o, &[rg(0, 3)], b"PRE").await.unwrap();
    s.admin.set_auth_scheme(P, AuthScheme::CAPABILITIES).await.unwrap();
    assert_eq!(
        refused(both.write(P, o, &[rg(0, 3)], b"pre").await),
        Status::RightsInsufficient,
        "the capability reads only"
    );
    assert_eq!(both.known_scheme(P), Some(AuthScheme::CAPABILITIES));
    s.admin.write(P, o, &[rg(0, 3)], b"pre").await.unwrap();

    // A client that knows nothing yet asks the drive first.
    let mut fresh = s.client(Drive::mint(&s.d.working, &args)).await;
    fresh.set_identity(Some(Auth::new(identity(&s.k1, 1, ALICE, NO_ROLE, far_future()), PROTECTION)));
    s.admin.set_auth_scheme(P, AuthScheme::PALS).await.unwrap();
    assert_eq!(fresh.read(P, o, &whole()).await.unwrap().1, DATA);
    assert_eq!(fresh.known_scheme(P), Some(AuthScheme::PALS));
    // An identity alone, and a capability alone, do not switch.
    let mut only_cap = s.client(Drive::mint(&s.d.working, &args)).await;
    assert_eq!(refused(only_cap.read(P, o, &whole()).await), Status::AuthSchemeRefused);
    let mut only_id = DriveClient::connect(s.d.addr).await.unwrap();
    only_id.set_identity(Some(Auth::new(identity(&s.k1, 1, ALICE, NO_ROLE, far_future()), PROTECTION)));
    assert_eq!(only_id.read(P, o, &whole()).await.unwrap().1, DATA, "an identity with no Auth is used as is");
    s.admin.set_auth_scheme(P, AuthScheme::BOTH).await.unwrap();
    s.admin.set_pal(P, o, &pal(0, vec![user(ALICE, R), role(EDITORS, RW)])).await.unwrap();
    s.unchanged().await;
}
