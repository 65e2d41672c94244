//! Informed prefetching end to end (NASD §3.4, §4.6): real drives with the
//! `prefetch-v1` extension, the real TLS manager, `nasd_fs::HintedReads`.
//!
//! - hinted reads at random places (from a printed seed) are read ahead by
//!   the drives and then served from their caches, byte-exact;
//! - hints whose capability is revoked (a chmod) before the drive reaches
//!   them are dropped, never read;
//! - a drive names the extension in INQUIRY, and an extension it does not
//!   have is refused with `UNKNOWN_EXTENSION`.

mod common;

use common::seeded::{seed, Rng};
use common::*;
use nasd_fs::{HintedReads, Layout};
use std::time::Duration;

const MIB: u64 = 1024 * 1024;

/// Sums a counter over the cluster's drives.
fn total(c: &Cluster, f: impl Fn(&nasd_drive::DriveMetrics) -> u64) -> u64 {
    c.drives.iter().map(|d| f(&d.metrics)).sum()
}

/// Waits (up to a minute) until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..600 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn cluster() -> Cluster {
    let root_layout = Some(Layout::parse("stripe:4@64K").expect("layout"));
    Cluster::start(ClusterOptions { root_layout, ..Default::default() }).await
}

#[test]
fn hinted_reads_are_read_ahead_and_served_from_the_drives_caches() {
    run(async {
        let seed = seed("hinted reads");
        let c = cluster().await;
        let fs = c.login(ADMIN, ADMIN_PW).await;
        let size = 8 * MIB;
        let data = pattern(seed, size as usize);
        let f = to(fs.create("/cube", 0o644, true, false)).await.expect("create");
        to(f.write_at(0, &data)).await.expect("write");
        to(f.close()).await.expect("close");

        let mut rng = Rng(seed);
        let reads: Vec<(u64, u64)> = (0..150).map(|_| (rng.below(size - 4096), 4096)).collect();
        let f = to(fs.open("/cube", false)).await.expect("open");
        let hits_before = total(&c, |m| m.prefetch_cache_hits());
        let mut hinted = to(HintedReads::new(&f, reads.clone())).await.expect("hints sent");
        let queued = total(&c, |m| m.prefetch_hints_total("queued"));
        assert!(queued >= reads.len() as u64, "every read hinted: {queued} queued for {} reads", reads.len());
        until("the drives to read every hint ahead", || total(&c, |m| m.prefetch_hints_total("read")) == queued).await;
        let mut made = 0;
        while let Some((offset, bytes)) = to(hinted.next_read()).await.expect("read") {
            assert_eq!(bytes, data[offset as usize..offset as usize + 4096], "read at {offset}");
            made += 1;
        }
        assert_eq!(made, reads.len());
        to(hinted.end()).await;
        let hits = total(&c, |m| m.prefetch_cache_hits()) - hits_before;
        assert!(hits >= reads.len() as u64, "each read served from a cache: {hits} block hits for {made} reads");
        until("the stream's blocks dropped", || total(&c, |m| m.prefetch_cache_bytes()) == 0).await;
    });
}

#[test]
fn hints_of_a_revoked_capability_are_dropped_unread() {
    run(async {
        let c = cluster().await;
        let fs = c.login(ADMIN, ADMIN_PW).await;
        // 20 MiB per drive: more than a stream may hold ahead (a quarter of
        // the 64 MiB cache), so each drive stops after the first hint (a
        // stream's hints are read in order) until the client reports progress.
        let size = 80 * MIB;
        let f = to(fs.create("/big", 0o644, true, false)).await.expect("create");
        for i in 0..size / (8 * MIB) {
            to(f.write_at(i * 8 * MIB, &pattern(i, 8 * MIB as usize))).await.expect("write");
        }
        to(f.close()).await.expect("close");
        let f = to(fs.open("/big", false)).await.expect("open");
        let stream = 42;
        let mut reads = vec![(0u32, 0u64, size)];
        reads.extend((1..=8u32).map(|i| (i, u64::from(i) * MIB, 4096)));
        let queued = to(f.hint_reads(stream, &reads)).await.expect("hints");
        assert!(queued >= 12, "{queued} hints queued");
        until("the first hint read ahead on each drive", || total(&c, |m| m.prefetch_hints_total("read")) == 4).await;
        // Others lose their read right: the drives' access control version moves.
        to(fs.chmod("/big", 0o640)).await.expect("chmod");
        to(f.hint_progress(stream, 0)).await;
        until("the later hints dropped", || total(&c, |m| m.prefetch_hints_total("revoked")) == queued - 4).await;
        assert_eq!(total(&c, |m| m.prefetch_hints_total("read")), 4, "no hint read after the revocation");
        // The file itself still reads (a fresh capability).
        assert_eq!(to(f.read_at(MIB, 16)).await.expect("read"), pattern(0, 8 * MIB as usize)[MIB as usize..][..16]);
    });
}

#[test]
fn drives_list_the_extension_and_refuse_others() {
    run(async {
        let c = cluster().await;
        let mut d = nasd_client::DriveClient::connect(c.drives[0].addr).await.expect("connect");
        let info = to(d.inquiry()).await.expect("inquiry");
        assert!(info.extensions.iter().any(|e| e == nasd_proto::extension::PREFETCH), "{:?}", info.extensions);
        let refused = to(d.extension(1, 0, "x-no-such", vec![])).await.expect_err("unknown extension");
        assert_eq!(refused.status(), Some(nasd_proto::Status::UnknownExtension), "{refused}");
    });
}
