//! Requests verified per second on one core: the drive's authentication of a
//! capability-protected request (checks 1–8), with the capability-key cache
//! warm (the same capability again) and cold (a new capability every time);
//! and (group `authorize 4 KiB read`) the whole verification of a 4 KiB
//! `READ` — frame parsed, checks 1–8, arguments decoded, checks 11–12 —
//! under a capability (cache warm and cold) and under an identity checked
//! against the object's PALs (DSFS: idkey recomputed from the credential,
//! then the PAL match, which reads the object's PALs from the store).
//! Frames are built outside the timed section.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use nasd_crypto::{identity_key, key_context, mint_capability, seal_key, FrameKeys, Key, MacAlgorithm};
use nasd_drive::Security;
use nasd_proto::{
    opcode, rights, AttrMask, Attributes, AuthScheme, CapabilityArgs, FrameHeader, FramePrefix, IdentityData, KeyType,
    ObjectPal, Pal, PalEntry, Principal, Protection, Region, Request,
};
use nasd_store::{Store, StoreOptions};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<Store>,
    security: Security,
    working: Key,
    identity: Key,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        Store::open(dir.path(), &StoreOptions { block_size: 4096, capacity_bytes: 1 << 30, ..Default::default() })
            .unwrap(),
    );
    // A 1 s skew: the replay cache holds NONCE_CACHE_MAX nonces per window, and
    // one core verifies more than that in the default 5 s window.
    store.initialize(0, 1_000_000_000).unwrap();
    let master = Key::random();
    let security = Security::open(store.clone(), Some(master.clone()), true).unwrap();
    let (drive, part, working) = (Key::random(), Key::random(), Key::random());
    store.create_partition(1).unwrap();
    let manage = |r: Request| security.manage(&r).map_err(|(s, m)| format!("{s}: {m}")).unwrap();
    manage(Request::SetDriveKey { sealed_key: seal_key(&master, &key_context(opcode::SET_DRIVE_KEY, 0, 0), &drive) });
    manage(Request::SetPartitionKey {
        partition: 1,
        sealed_key: seal_key(&drive, &key_context(opcode::SET_PARTITION_KEY, 1, 0), &part),
    });
    manage(Request::SetWorkingKey {
        partition: 1,
        key_version: 1,
        sealed_key: seal_key(&part, &key_context(opcode::SET_WORKING_KEY, 1, 1), &working),
    });
    let identity = Key::random();
    manage(Request::SetIdentityKey {
        key_id: 1,
        sealed_key: seal_key(&drive, &key_context(opcode::SET_IDENTITY_KEY, 0, 1), &identity),
    });
    manage(Request::SetAuthScheme { partition: 1, scheme: AuthScheme::BOTH });
    // Object 16 (a PAL of 2 entries naming user 1000) and object 17 (a full
    // access PAL of PAL_ENTRIES_MAX users, none of them the reader, in a
    // collection whose full super PAL names the reader's role last).
    let (o16, _) = store.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let (o17, _) = store.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    assert_eq!((o16, o17), (16, 17));
    let entry = |principal, rights| PalEntry { principal, rights };
    let read = rights::READ | rights::GETATTR;
    let small = Pal::new(vec![entry(Principal::User(1000), read), entry(Principal::Role(7), read)]);
    store.set_pal(1, 16, ObjectPal { collection: 0, pal: small }).unwrap();
    let max = nasd_proto::limits::PAL_ENTRIES_MAX as u32;
    let users = Pal::new((0..max).map(|i| entry(Principal::User(50_000 + i), read)).collect());
    store.set_pal(1, 17, ObjectPal { collection: 9, pal: users }).unwrap();
    let roles = Pal::new((0..max).map(|i| entry(Principal::Role(100 + i), read)).collect());
    store.set_super_pal(1, 9, roles).unwrap();
    Fixture { _dir: dir, store, security, working, identity }
}

fn capability(f: &Fixture, audit_id: u64) -> CapabilityArgs {
    CapabilityArgs {
        algorithm: MacAlgorithm::Blake3 as u8,
        min_protection: Protection::INTEGRITY_ARGS,
        key_version: 1,
        drive_id: f.store.drive_id(),
        partition: 1,
        object: 16,
        region: Region { offset: 0, length: 1 << 20 },
        access_control_version: 0,
        rights: rights::READ | rights::GETATTR,
        map_epoch: 0,
        expiration_ns: u64::MAX,
        audit_id,
    }
}

static SEQ: AtomicU64 = AtomicU64::new(1);

/// A protected 4 KiB read request under `cap`: (frame bytes, header).
fn frame(f: &Fixture, cap: &CapabilityArgs) -> (Vec<u8>, FrameHeader) {
    let (token, key) = mint_capability(&f.working, cap, false).unwrap();
    read_frame(f, KeyType::Capability, &token, &key, 16)
}

/// A protected 4 KiB read of `object` under an identity of user 1000 in
/// `role`: (frame bytes, header).
fn identity_frame(f: &Fixture, role: u32, object: u64) -> (Vec<u8>, FrameHeader) {
    let data =
        IdentityData { algorithm: MacAlgorithm::Blake3 as u8, key_id: 1, user: 1000, role, expiration_ns: u64::MAX };
    let key = identity_key(&f.identity, &data).unwrap();
    read_frame(f, KeyType::Identity, &data.encode(), &key, object)
}

fn read_frame(f: &Fixture, key_type: KeyType, field: &[u8], key: &Key, object: u64) -> (Vec<u8>, FrameHeader) {
    let req = Request::Read { partition: 1, object, regions: vec![Region { offset: 0, length: 4096 }] };
    let mut h = FrameHeader::request(req.opcode(), 1);
    h.key_type = key_type;
    h.protection = Protection::INTEGRITY_ARGS;
    h.nonce = nasd_proto::nonce(f.store.now_ns(), SEQ.fetch_add(1, Ordering::Relaxed));
    let mut bytes = FramePrefix::encode(&h, field, &req.encode_args(), &[0; 32]);
    let split = bytes.len() - 32;
    let d = FrameKeys::new(MacAlgorithm::Blake3, key).digest(h.protection, &bytes[..split]);
    bytes[split..].copy_from_slice(&d);
    let header = FramePrefix::parse(&bytes).unwrap().header;
    (bytes, header)
}

/// Everything the drive does to a request before it runs it: parse the
/// prefix, checks 1–8, decode the arguments, checks 11–12.
fn verify_and_authorize(f: &Fixture, bytes: &[u8]) {
    let p = FramePrefix::parse(bytes).unwrap();
    let a = f.security.authenticate(&p.header, p.capability, &bytes[..bytes.len() - 32], &p.digest).unwrap();
    f.security.check_fresh(&a, &p.header).unwrap();
    let req = Request::decode(p.header.opcode, p.args).unwrap();
    f.security.authorize(&a, &req).unwrap();
}

fn verify(c: &mut Criterion) {
    let f = fixture();
    let mut g = c.benchmark_group("authenticate");
    g.throughput(Throughput::Elements(1));
    let warm = capability(&f, 7);
    g.bench_function("capability cache warm", |b| {
        b.iter_batched(
            || frame(&f, &warm),
            |(bytes, h)| {
                let p = FramePrefix::parse(&bytes).unwrap();
                {
                    let a = f.security.authenticate(&h, p.capability, &bytes[..bytes.len() - 32], &p.digest).unwrap();
                    f.security.check_fresh(&a, &h).unwrap()
                }
            },
            BatchSize::SmallInput,
        )
    });
    let audit = AtomicU64::new(1_000_000);
    g.bench_function("capability cache cold", |b| {
        b.iter_batched(
            || frame(&f, &capability(&f, audit.fetch_add(1, Ordering::Relaxed))),
            |(bytes, h)| {
                let p = FramePrefix::parse(&bytes).unwrap();
                {
                    let a = f.security.authenticate(&h, p.capability, &bytes[..bytes.len() - 32], &p.digest).unwrap();
                    f.security.check_fresh(&a, &h).unwrap()
                }
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();

    let mut g = c.benchmark_group("authorize 4 KiB read");
    g.throughput(Throughput::Elements(1));
    g.bench_function("capability cache warm", |b| {
        b.iter_batched(|| frame(&f, &warm).0, |bytes| verify_and_authorize(&f, &bytes), BatchSize::SmallInput)
    });
    g.bench_function("capability cache cold", |b| {
        b.iter_batched(
            || frame(&f, &capability(&f, audit.fetch_add(1, Ordering::Relaxed))).0,
            |bytes| verify_and_authorize(&f, &bytes),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("identity, PAL of 2 entries", |b| {
        b.iter_batched(|| identity_frame(&f, 0, 16).0, |bytes| verify_and_authorize(&f, &bytes), BatchSize::SmallInput)
    });
    let last_role = 100 + nasd_proto::limits::PAL_ENTRIES_MAX as u32 - 1;
    g.bench_function("identity, full PAL and super PAL", |b| {
        b.iter_batched(
            || identity_frame(&f, last_role, 17).0,
            |bytes| verify_and_authorize(&f, &bytes),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, verify);
criterion_main!(benches);
