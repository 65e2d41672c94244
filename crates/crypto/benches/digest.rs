//! Block digest throughput at candidate block sizes (used to pick the default).
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn digest(c: &mut Criterion) {
    let mut g = c.benchmark_group("block_digest");
    for size in [4096usize, 16 * 1024, 64 * 1024, 256 * 1024, 1024 * 1024] {
        let block = vec![0x5au8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &block, |b, block| {
            b.iter(|| nasd_crypto::block_digest(block))
        });
    }
    g.finish();
}

criterion_group!(benches, digest);
criterion_main!(benches);
