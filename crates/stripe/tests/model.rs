//! Random write and read sequences against an in-memory model buffer on
//! real drives (rs:2+1, where partial stripes are read-modify-written, and
//! mirror:2), then every byte read again with each component in turn marked
//! `Down` — which checks that parity and copies agree with the data. Plus the
//! sequential helpers (read-ahead, write-behind).

mod common;

use common::*;
use nasd_proto::layout::ComponentState;
use nasd_stripe::{ReadAhead, StripeError, WriteBehind};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[derive(Debug, Clone)]
enum Step {
    Write { offset: u64, len: usize, seed: u64 },
    Read { offset: u64, len: u64 },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        3 => (0u64..70_000, 1usize..20_000, any::<u64>()).prop_map(|(offset, len, seed)| Step::Write { offset, len, seed }),
        1 => (0u64..80_000, 0u64..40_000).prop_map(|(offset, len)| Step::Read { offset, len }),
    ];
    proptest::collection::vec(step, 1..10)
}

fn model_write(model: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let end = offset as usize + data.len();
    if model.len() < end {
        model.resize(end, 0);
    }
    model[offset as usize..end].copy_from_slice(data);
}

fn model_read(model: &[u8], offset: u64, len: u64) -> &[u8] {
    let end = offset.saturating_add(len).min(model.len() as u64);
    if offset >= end {
        return &[];
    }
    &model[offset as usize..end as usize]
}

/// Runs `f` on a runtime of its own, from a thread with a large stack.
fn on_runtime(f: impl FnOnce(&tokio::runtime::Runtime) + Send) {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(32 * 1024 * 1024)
            .spawn_scoped(scope, || {
                let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
                f(&rt);
            })
            .unwrap()
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
    });
}

#[test]
fn random_writes_and_reads_match_the_model() {
    on_runtime(|rt| {
        let cluster = rt.block_on(Cluster::start(3));
        for layout in ["rs:2+1@4K", "mirror:2@4K"] {
            let mut runner = TestRunner::new(Config { cases: 24, failure_persistence: None, ..Config::default() });
            let result = runner.run(&steps(), |steps| {
                rt.block_on(async {
                    let target = cluster.target(layout, 0, Cred::DriveKey).await;
                    let s = cluster.striper(target.clone(), small_batches());
                    let mut model = Vec::new();
                    for step in &steps {
                        match *step {
                            Step::Write { offset, len, seed } => {
                                let data = pattern(seed, len);
                                let outcome = to(s.write(offset, &data, model.len() as u64)).await;
                                let outcome = outcome.map_err(|e| TestCaseError::fail(format!("{step:?}: {e}")))?;
                                prop_assert!(outcome.missed.is_empty());
                                model_write(&mut model, offset, &data);
                            }
                            Step::Read { offset, len } => {
                                let (back, _) = to(s.read(offset, len, model.len() as u64)).await.unwrap();
                                prop_assert!(back == model_read(&model, offset, len), "{:?}", step);
                            }
                        }
                    }
                    // Each component lost in turn: parity and copies agree with the data.
                    for lost in 0..target.components.len() {
                        let mut degraded = target.clone();
                        degraded.components[lost].state = ComponentState::Down;
                        let s = cluster.striper(degraded, small_batches());
                        let size = model.len() as u64;
                        let (back, _) = to(s.read(0, size, size)).await.unwrap();
                        prop_assert!(back == model, "{layout}: component {lost} lost: bytes differ");
                    }
                    Ok(())
                })
            });
            if let Err(e) = result {
                panic!("{layout}: {e}");
            }
        }
    });
}

#[test]
fn read_ahead_serves_sequential_reads_and_seeks() {
    run(async {
        let c = Cluster::start(3).await;
        let target = c.target("rs:2+1@4K", 0, Cred::DriveKey).await;
        let s = c.striper(target, small_batches());
        let data = pattern(3, 1 << 20);
        to(s.write(0, &data, 0)).await.unwrap();
        let size = data.len() as u64;
        let mut ra = ReadAhead::with_window(s.clone(), 100_000);
        let mut back = Vec::new();
        while (back.len() as u64) < size {
            let (piece, report) = to(ra.read(back.len() as u64, 10_007, size)).await.unwrap();
            assert!(!piece.is_empty() && report.is_clean());
            back.extend_from_slice(&piece);
        }
        assert!(back == data, "sequential reads through the window");
        for (offset, len) in [(5, 300_000), (900_000, 500_000), (10, 1), (11, 50_000), (size, 5), (size - 3, 10)] {
            let (piece, _) = to(ra.read(offset, len, size)).await.unwrap();
            assert!(piece == model_read(&data, offset, len), "read {offset}+{len} after a seek");
        }
    });
}

/// Reads of one sequential pass that arrive a few at a time in any order
/// (as a kernel's concurrent read-ahead delivers them), with now and then a
/// read far away: each returns the model's bytes.
#[test]
fn read_ahead_serves_reads_that_arrive_out_of_order() {
    on_runtime(|rt| {
        let c = rt.block_on(Cluster::start(3));
        let target = rt.block_on(c.target("rs:2+1@4K", 0, Cred::DriveKey));
        let s = c.striper(target, small_batches());
        let data = pattern(5, 700_001);
        rt.block_on(to(s.write(0, &data, 0))).unwrap();
        let size = data.len() as u64;
        let plan = (1u64..30_000, 1usize..6, proptest::collection::vec(any::<u64>(), 64), 0u8..4);
        let mut runner = TestRunner::new(Config { cases: 24, failure_persistence: None, ..Config::default() });
        let result = runner.run(&plan, |(piece, group, draws, seeks)| {
            rt.block_on(async {
                let mut ra = ReadAhead::with_window(s.clone(), 50_000);
                let mut draws = draws.iter().cycle();
                let offsets: Vec<u64> = (0..size.div_ceil(piece)).map(|i| i * piece).collect();
                for batch in offsets.chunks(group) {
                    let mut batch = batch.to_vec();
                    for i in (1..batch.len()).rev() {
                        batch.swap(i, (*draws.next().unwrap() % (i as u64 + 1)) as usize);
                    }
                    for offset in batch {
                        let (back, _) = to(ra.read(offset, piece, size)).await.unwrap();
                        prop_assert!(back == model_read(&data, offset, piece), "read {offset}+{piece}");
                    }
                    if *draws.next().unwrap() % 16 < u64::from(seeks) {
                        let offset = draws.next().unwrap() % size;
                        let (back, _) = to(ra.read(offset, piece, size)).await.unwrap();
                        prop_assert!(back == model_read(&data, offset, piece), "seek to {offset}+{piece}");
                    }
                }
                Ok(())
            })
        });
        if let Err(e) = result {
            panic!("{e}");
        }
    });
}

#[test]
fn write_behind_gathers_small_writes_into_stripes() {
    run(async {
        let c = Cluster::start(6).await;
        let target = c.target("rs:4+2@4K", 0, Cred::DriveKey).await;
        let s = c.striper(target, small_batches());
        let mut model = pattern(1, 10_000);
        to(s.write(0, &model, 0)).await.unwrap();
        let mut wb = WriteBehind::new(s.clone(), model.len() as u64).unwrap();
        let data = pattern(2, 700_001);
        let mut at = 5_000u64;
        for piece in data.chunks(777) {
            to(wb.write(at, piece)).await.unwrap();
            model_write(&mut model, at, piece);
            at += piece.len() as u64;
        }
        // Not contiguous: an overwrite inside what is in flight, and a far one.
        for (offset, seed) in [(100_000u64, 7u64), (2_000_000, 8)] {
            let piece = pattern(seed, 5_000);
            to(wb.write(offset, &piece)).await.unwrap();
            model_write(&mut model, offset, &piece);
        }
        assert_eq!(wb.size(), model.len() as u64);
        let outcome = to(wb.flush()).await.unwrap();
        assert!(outcome.missed.is_empty() && outcome.written.len() == 6, "{outcome:?}");
        let size = model.len() as u64;
        let (back, _) = to(s.read(0, size, size)).await.unwrap();
        assert!(back == model);
    });
}

#[test]
fn a_background_write_error_surfaces_and_is_not_lost() {
    run(async {
        let mut c = Cluster::start(2).await;
        let target = c.target("stripe:2@4K", 0, Cred::DriveKey).await;
        let s = c.striper(target.clone(), small_batches());
        let mut wb = WriteBehind::new(s, 0).unwrap();
        let d = c.drive_of(&target.components[1]);
        c.drives[d].stop();
        let data = pattern(4, 300_000);
        // Either a later write or the wait reports it, once.
        let mut first = None;
        for (i, piece) in data.chunks(10_000).enumerate() {
            if let Err(e) = to(wb.write(i as u64 * 10_000, piece)).await {
                first = Some(e);
                break;
            }
        }
        let first = match first {
            Some(e) => e,
            None => to(wb.wait()).await.expect_err("the stopped drive fails a background write"),
        };
        assert!(
            matches!(first, StripeError::WriteBehind(ref e) if matches!(**e, StripeError::Unavailable { .. })),
            "{first}"
        );
        assert!(matches!(to(wb.write(0, b"more")).await, Err(StripeError::WriteBehindBroken)));
        assert!(matches!(to(wb.flush()).await, Err(StripeError::WriteBehindBroken)));
    });
}
