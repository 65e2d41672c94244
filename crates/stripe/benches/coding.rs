//! Reed-Solomon throughput of one stripe on one core, in MiB/s of file data
//! (the `k` data shards): encoding its parity, and reconstructing it with
//! `m` data shards lost (the worst case a degraded read meets). 1 MiB
//! stripe units, at rs:4+2 and rs:2+1.
//!
//! `cargo bench -p nasd-stripe --bench coding`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use nasd_stripe::coding::Coder;

const UNIT_BYTES: usize = 1024 * 1024;

fn shards(k: usize) -> Vec<Vec<u8>> {
    (0..k).map(|i| (0..UNIT_BYTES).map(|j| (j as u8).wrapping_mul(31).wrapping_add(i as u8)).collect()).collect()
}

fn bench(c: &mut Criterion) {
    for (k, m) in [(4usize, 2usize), (2, 1)] {
        let coder = Coder::new(k, m).unwrap();
        let data = shards(k);
        let parity = coder.encode(&data, UNIT_BYTES).unwrap();
        let mut group = c.benchmark_group(format!("rs:{k}+{m}@1M"));
        group.throughput(Throughput::Bytes((k * UNIT_BYTES) as u64));
        group.sample_size(20);
        group.bench_function("encode", |b| b.iter(|| coder.encode(&data, UNIT_BYTES).unwrap()));
        group.bench_function(format!("reconstruct {m} lost data shards"), |b| {
            b.iter_batched(
                || {
                    let mut s: Vec<Option<Vec<u8>>> = data.iter().chain(&parity).cloned().map(Some).collect();
                    s[..m].iter_mut().for_each(|x| *x = None);
                    s
                },
                |mut s| coder.reconstruct(&mut s, UNIT_BYTES, false).unwrap(),
                BatchSize::LargeInput,
            )
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
