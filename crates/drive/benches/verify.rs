//! Requests verified per second on one core: the drive's authentication of a
//! capability-protected request (checks 1–8), with the capability-key cache
//! warm (the same capability again) and cold (a new capability every time).
//! Frames are built outside the timed section.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use nasd_crypto::{key_context, mint_capability, seal_key, FrameKeys, Key, MacAlgorithm};
use nasd_drive::Security;
use nasd_proto::{opcode, rights, CapabilityArgs, FrameHeader, FramePrefix, KeyType, Protection, Region, Request};
use nasd_store::{Store, StoreOptions};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<Store>,
    security: Security,
    working: Key,
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
    Fixture { _dir: dir, store, security, working }
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
    let req = Request::Read { partition: 1, object: 16, regions: vec![Region { offset: 0, length: 4096 }] };
    let mut h = FrameHeader::request(req.opcode(), 1);
    h.key_type = KeyType::Capability;
    h.protection = Protection::INTEGRITY_ARGS;
    h.nonce = nasd_proto::nonce(f.store.now_ns(), SEQ.fetch_add(1, Ordering::Relaxed));
    let mut bytes = FramePrefix::encode(&h, &token, &req.encode_args(), &[0; 32]);
    let split = bytes.len() - 32;
    let d = FrameKeys::new(MacAlgorithm::Blake3, &key).digest(h.protection, &bytes[..split]);
    bytes[split..].copy_from_slice(&d);
    let header = FramePrefix::parse(&bytes).unwrap().header;
    (bytes, header)
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
}

criterion_group!(benches, verify);
criterion_main!(benches);
