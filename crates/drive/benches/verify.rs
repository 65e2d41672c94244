//! Requests verified per second on one core: the drive's authentication of a
//! capability-protected request (checks 1–8), with the capability-key cache
//! warm (the same capability again) and cold (a new capability every time);
//! and (group `authorize 4 KiB read`) the whole verification of a 4 KiB
//! `READ` — frame parsed, checks 1–8, arguments decoded, checks 11–12 —
//! under a capability (cache warm and cold) and under an identity checked
//! against the object's PALs (DSFS: idkey recomputed from the credential,
//! then the PAL match, which reads the object's PALs from the store).
//! Frames are built outside the timed section.

mod fixture;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fixture::{capability, fixture, frame, identity_frame, verify_and_authorize};
use nasd_proto::FramePrefix;
use std::sync::atomic::{AtomicU64, Ordering};

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
