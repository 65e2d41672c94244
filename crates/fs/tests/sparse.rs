//! Large sparse files through `nasd_fs::File` over real drives: reads of a
//! file of at least `HOLE_SKIP_FILE_BYTES_MIN` find its holes from the
//! drives' extents and serve them as zeros without reading them; the run
//! of data or hole a read found is forgotten at every write of the file and
//! at every open. A seeded random mix of writes (data and zeros, in holes
//! and over data), reads, flushes and reopens on each scheme, checked
//! against a model of the bytes: `NASD_SEED=N` replays a run.

mod common;

use common::seeded::{seed, Rng};
use common::*;
use nasd_fs::{Layout, Seek, HOLE_SKIP_FILE_BYTES_MIN};

const MIB: u64 = 1 << 20;
/// The file's size: past the size from which holes are skipped.
const SIZE: u64 = HOLE_SKIP_FILE_BYTES_MIN + 32 * MIB;
/// Operations per layout.
const OPS: usize = 60;

#[test]
fn sparse_files_read_back_exactly_while_they_are_written() {
    let seed = seed("sparse reads");
    for (i, text) in ["rs:2+1@64K", "mirror:2@256K", "stripe:3@64K"].into_iter().enumerate() {
        run(async move {
            let layout = Layout::parse(text).unwrap();
            let c = Cluster::start(ClusterOptions { drives: 4, root_layout: Some(layout), ..Default::default() }).await;
            let fs = c.login(ADMIN, ADMIN_PW).await;
            let mut rng = Rng(seed.wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1);
            let mut model = vec![0u8; SIZE as usize];
            let mut f = to(fs.create("/sparse", 0o644, true, false)).await.unwrap();
            to(f.write_at(SIZE - 1, &[0xEE])).await.unwrap();
            model[SIZE as usize - 1] = 0xEE;
            for op in 0..OPS {
                let what = format!("{text} op {op}");
                match rng.below(10) {
                    0..=3 => {
                        let len = 1 + rng.below(600_000);
                        let at = rng.below(SIZE - len);
                        let data =
                            if rng.below(4) == 0 { vec![0u8; len as usize] } else { pattern(rng.next(), len as usize) };
                        to(f.write_at(at, &data)).await.unwrap_or_else(|e| panic!("{what}: write {at}+{len}: {e}"));
                        model[at as usize..(at + len) as usize].copy_from_slice(&data);
                    }
                    4..=7 => {
                        let len = 1 + rng.below(24 * MIB);
                        let at = rng.below(SIZE);
                        let got =
                            to(f.read_at(at, len)).await.unwrap_or_else(|e| panic!("{what}: read {at}+{len}: {e}"));
                        let end = (at + len).min(SIZE) as usize;
                        assert!(got == model[at as usize..end], "{what}: read {at}+{len} differs (NASD_SEED={seed})");
                        // SEEK_DATA never skips data.
                        if let Some(d) = model[at as usize..].iter().position(|&b| b != 0).map(|p| at + p as u64) {
                            let found = to(f.seek(Seek::Data, at)).await.unwrap();
                            assert!(
                                found.is_some_and(|x| x <= d),
                                "{what}: SEEK_DATA from {at} = {found:?}, data at {d}"
                            );
                        }
                    }
                    8 => to(f.flush()).await.unwrap_or_else(|e| panic!("{what}: flush: {e}")),
                    _ => {
                        to(f.close()).await.unwrap_or_else(|e| panic!("{what}: close: {e}"));
                        f = to(fs.open("/sparse", true)).await.unwrap();
                    }
                }
            }
            to(f.close()).await.unwrap();
            let whole = to(fs.read_file("/sparse")).await.unwrap();
            assert!(whole == model, "{text}: the whole file differs (NASD_SEED={seed})");
            drop(fs);
            c.stop().await;
        });
    }
}
