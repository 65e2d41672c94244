//! Write transactions across a SIGKILL of the real `nasd drive` binary.
//!
//! The drive runs as a child process with a long commit interval, so only
//! `FLUSH` makes anything durable. A coordinator opens transactions on two
//! objects, the client overwrites, extends and truncates them and flushes
//! (what BEGIN_WRITE … FLUSH … COMMIT does), writes more without flushing,
//! and the drive is killed. After the restart both transactions are still
//! open; aborting one restores its old bytes exactly, committing the other
//! keeps the new ones. The ends themselves are not flushed before a second
//! kill: after it the transactions may be open again, and ending them again
//! (recovery) gives the same result. A last kill after a flush, and a direct
//! look at the store with every block's digest checked, confirm it is durable.

mod common;

use common::{log_tail, Daemon};
use nasd_client::{Auth, Credential, DriveClient};
use nasd_crypto::Key;
use nasd_proto::{AttrMask, Attributes, Protection, Region};
use nasd_store::{Store, StoreOptions, VecSink};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::Path;

const P: u64 = 1;
const BS: u64 = 4096;
const PROTECTION: Protection = Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA);
/// Long enough that nothing but FLUSH commits while the test runs.
const COMMIT_INTERVAL_MS: &str = "600000";

fn start_drive(dir: &Path) -> Daemon {
    let data = dir.join("data");
    Daemon::start("drive", dir, &dir.join("drive.log"), None, move |addr| {
        let mut args: Vec<OsString> = vec!["drive".into(), "--data".into(), data.clone().into()];
        args.extend(["--listen".into(), addr.to_string().into()]);
        args.extend(
            ["--capacity", "256MiB", "--block-size", "4KiB", "--commit-interval-ms", COMMIT_INTERVAL_MS]
                .map(OsString::from),
        );
        args
    })
}

async fn connect(addr: SocketAddr, key: &Key) -> DriveClient {
    let mut c = DriveClient::connect(addr).await.expect("connect");
    c.set_auth(Auth::new(Credential::Drive(key.clone()), PROTECTION));
    c
}

fn bytes(seed: u8, len: u64) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) | 1).collect()
}

fn rg(offset: u64, length: u64) -> Region {
    Region { offset, length }
}

async fn read_all(c: &mut DriveClient, o: u64) -> Vec<u8> {
    let size = c.getattr(P, o).await.expect("getattr").logical_size;
    if size == 0 {
        return Vec::new();
    }
    c.read(P, o, &[rg(0, size)]).await.expect("read").1
}

/// What the client does to each object inside its transaction (all flushed):
/// overwrite across the old end, extend, truncate into a block.
async fn transaction_writes(c: &mut DriveClient, o: u64, seed: u8) -> Vec<u8> {
    let mut v = read_all(c, o).await;
    let new = bytes(seed, 6 * BS);
    c.write(P, o, &[rg(BS / 2, 6 * BS)], &new).await.expect("write");
    v.resize((BS / 2 + 6 * BS) as usize, 0);
    v[(BS / 2) as usize..].copy_from_slice(&new);
    let size = 5 * BS + 17;
    c.setattr(P, o, AttrMask::LOGICAL_SIZE, &Attributes { logical_size: size, ..Default::default() })
        .await
        .expect("truncate");
    v.truncate(size as usize);
    c.write(P, o, &[rg(9 * BS, 5)], b"tail!").await.expect("write past the end");
    v.resize(9 * BS as usize, 0);
    v.extend_from_slice(b"tail!");
    v
}

#[test]
fn transactions_survive_sigkill_and_abort_to_the_old_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("drive.log");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let fail = |what: &str| -> String { format!("{what}\ndrive log:\n{}", log_tail(&log)) };

    // ---- set up; transactions, flushed writes, unflushed writes; kill
    let mut drive = start_drive(dir.path());
    let master = nasd_crypto::read_key_file(&dir.path().join("data/master.key")).expect("master key");
    let key = Key::random();
    let v1 = bytes(1, 3 * BS + 100);
    let (a, b, flushed) = rt.block_on(async {
        let mut c = DriveClient::connect(drive.addr).await.expect("connect");
        c.set_drive_key(&master, &key).await.expect("set_drive_key");
        let mut c = connect(drive.addr, &key).await;
        c.create_partition(P).await.unwrap();
        c.resize_partition(P, 128 << 20).await.unwrap();
        let (a, _) = c.create(P).await.unwrap();
        let (b, _) = c.create(P).await.unwrap();
        for o in [a, b] {
            c.write(P, o, &[rg(0, v1.len() as u64)], &v1).await.unwrap();
        }
        c.flush(P, &[a, b]).await.unwrap();
        c.txn_begin(P, a, 7001).await.unwrap();
        c.txn_begin(P, b, 7002).await.unwrap();
        let flushed = [transaction_writes(&mut c, a, 2).await, transaction_writes(&mut c, b, 3).await];
        c.flush(P, &[a, b]).await.unwrap();
        // Not flushed: lost with the kill, and an abort must not care.
        c.write(P, a, &[rg(0, 2 * BS)], &bytes(4, 2 * BS)).await.unwrap();
        c.write(P, b, &[rg(0, 2 * BS)], &bytes(5, 2 * BS)).await.unwrap();
        (a, b, flushed)
    });
    drive.kill();

    // ---- restart: both transactions are open; end them, without a flush
    let mut drive = start_drive(dir.path());
    rt.block_on(async {
        let mut c = connect(drive.addr, &key).await;
        let open = c.txn_list(P, 0, 16).await.unwrap();
        let open: Vec<(u64, u64)> = open.iter().map(|t| (t.object, t.txn)).collect();
        assert_eq!(open, vec![(a, 7001), (b, 7002)], "{}", fail("open transactions after the kill"));
        assert_eq!(read_all(&mut c, a).await, flushed[0], "{}", fail("a: the flushed state survived"));
        assert_eq!(read_all(&mut c, b).await, flushed[1], "{}", fail("b: the flushed state survived"));
        assert!(c.txn_end(P, a, 7001, false).await.unwrap());
        assert!(c.txn_end(P, b, 7002, true).await.unwrap());
        assert_eq!(read_all(&mut c, a).await, v1, "{}", fail("a: abort restores the old bytes exactly"));
        assert_eq!(read_all(&mut c, b).await, flushed[1], "{}", fail("b: commit keeps the new bytes"));
    });
    drive.kill();

    // ---- the ends were not flushed: recovery ends again, same result
    let mut drive = start_drive(dir.path());
    rt.block_on(async {
        let mut c = connect(drive.addr, &key).await;
        c.txn_end(P, a, 7001, false).await.unwrap();
        c.txn_end(P, b, 7002, true).await.unwrap();
        assert_eq!(c.txn_list(P, 0, 16).await.unwrap(), vec![]);
        assert_eq!(read_all(&mut c, a).await, v1, "{}", fail("a after a second abort"));
        assert_eq!(read_all(&mut c, b).await, flushed[1], "{}", fail("b after a second commit"));
        c.flush_partition(P).await.unwrap();
    });
    drive.kill();

    // ---- durable: after another kill, and in the store itself
    let mut drive = start_drive(dir.path());
    rt.block_on(async {
        let mut c = connect(drive.addr, &key).await;
        assert_eq!(c.txn_list(P, 0, 16).await.unwrap(), vec![], "{}", fail("ends are durable"));
        assert!(!c.txn_end(P, a, 7001, false).await.unwrap());
        assert_eq!(read_all(&mut c, a).await, v1);
        assert_eq!(read_all(&mut c, b).await, flushed[1]);
    });
    drive.terminate();
    let opts =
        StoreOptions { block_size: BS as u32, capacity_bytes: 256 << 20, verify_reads: true, ..Default::default() };
    let store = Store::open(&dir.path().join("data"), &opts).expect("store opens");
    for (o, want) in [(a, &v1), (b, &flushed[1])] {
        let mut sink = VecSink::default();
        store.read(P, o, &[rg(0, want.len() as u64 + BS)], &mut sink).expect("every block matches its digest");
        assert_eq!(&sink.data, want, "object {o} read from the store directly");
    }
    assert_eq!(store.txn_list(P, 0, 16).unwrap(), vec![]);
}
