//! Encoding and decoding a request frame prefix: the per-request CPU cost a
//! drive pays before any data moves.
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use nasd_proto::{FrameHeader, FramePrefix, Region, Request};

fn frame(c: &mut Criterion) {
    let regions: Vec<Region> = (0..16).map(|i| Region { offset: i << 20, length: 4096 }).collect();
    let req = Request::Write { partition: 7, object: 1234, regions };
    let mut h = FrameHeader::request(req.opcode(), 42);
    h.data_len = 16 * 4096;
    h.chunk_len = 65536;
    let bytes = FramePrefix::encode(&h, &[], &req.encode_args(), &[0; 32]);
    c.bench_function("encode write request, 16 regions", |b| {
        b.iter(|| FramePrefix::encode(black_box(&h), &[], &black_box(&req).encode_args(), &[0; 32]))
    });
    c.bench_function("decode write request, 16 regions", |b| {
        b.iter(|| {
            let p = FramePrefix::parse(black_box(&bytes)).unwrap();
            Request::decode(p.header.opcode, p.args).unwrap()
        })
    });
}

criterion_group!(benches, frame);
criterion_main!(benches);
