//! "Hash and MAC" reads (HASH_AND_MAC): the reply's data tags are MACs over
//! per-block digests — the drive's stored ones for whole blocks — and the
//! client recomputes the digests of what it received.

use nasd_client::{Auth, ClientError, Credential, DriveClient};
use nasd_crypto::Key;
use nasd_drive::{DriveConfig, SecurityMode};
use nasd_proto::{Protection, Region, Status};
use nasd_store::{Store, StoreOptions};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

const BS: u64 = 4096;

struct Drive {
    _dir: tempfile::TempDir,
    store: Arc<Store>,
    addr: std::net::SocketAddr,
    client: DriveClient,
    drive_key: Key,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(chunk_len: u32) -> Drive {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions { block_size: BS as u32, capacity_bytes: 256 << 20, ..Default::default() };
    let store = Arc::new(Store::open(dir.path(), &opts).unwrap());
    let master = Key::random();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = DriveConfig {
        chunk_len: Some(chunk_len),
        security: SecurityMode::Enforced { master_key: Some(master.clone()) },
        ..DriveConfig::default()
    };
    tokio::spawn(nasd_drive::serve(listener, store.clone(), config, async {
        let _ = stopped.await;
    }));
    let mut client = DriveClient::connect(addr).await.unwrap();
    let drive_key = Key::random();
    client.set_drive_key(&master, &drive_key).await.unwrap();
    client.set_auth(Auth::new(Credential::Drive(drive_key.clone()), Protection::INTEGRITY_ARGS));
    client.create_partition(1).await.unwrap();
    client.resize_partition(1, 64 << 20).await.unwrap();
    Drive { _dir: dir, store, addr, client, drive_key, _stop: stop }
}

impl Drive {
    /// A new connection under the drive key with `protection`.
    async fn connect(&self, protection: Protection) -> DriveClient {
        let mut c = DriveClient::connect(self.addr).await.unwrap();
        c.set_auth(Auth::new(Credential::Drive(self.drive_key.clone()), protection));
        c
    }

    /// XORs `mask` into byte `at` of logical block `block` of `object` on the media.
    fn rot(&self, object: u64, block: u64, at: u64, mask: u8) {
        let phys = self.store.block_map(1, object).unwrap()[block as usize].1.phys;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(self.store.dir().join("blocks.dat")).unwrap();
        let mut byte = [0u8; 1];
        f.read_exact_at(&mut byte, phys * BS + at).unwrap();
        f.write_all_at(&[byte[0] ^ mask], phys * BS + at).unwrap();
    }
}

fn hash_and_mac() -> Protection {
    Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA).union(Protection::HASH_AND_MAC)
}

fn expected(data: &[u8], regions: &[Region]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in regions {
        let end = (r.end() as usize).min(data.len());
        if (r.offset as usize) < end {
            out.extend_from_slice(&data[r.offset as usize..end]);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_round_trip_aligned_unaligned_and_across_chunks() {
    for chunk_len in [512u32, 1000, 256 * 1024] {
        let mut d = start(chunk_len).await;
        let c = &mut d.client;
        let (obj, _) = c.create(1).await.unwrap();
        let data: Vec<u8> = (0..(25 * BS + 777)).map(|i| (i * 31 % 253) as u8).collect();
        c.write(1, obj, &[Region { offset: 0, length: data.len() as u64 }], &data).await.unwrap();
        // A hole in the middle: whole zero blocks use the zero-block digest.
        c.write(1, obj, &[Region { offset: 40 * BS, length: 10 }], b"after hole").await.unwrap();
        let mut data = data;
        data.resize((40 * BS) as usize, 0);
        data.extend_from_slice(b"after hole");
        let d_auth = c.auth().clone();
        c.set_auth(Auth::new(d_auth.credential.clone(), hash_and_mac()));
        let cases: Vec<Vec<Region>> = vec![
            vec![Region { offset: 0, length: 8 * BS }],
            vec![Region { offset: 100, length: 5000 }],
            vec![Region { offset: BS - 1, length: 2 }],
            vec![
                Region { offset: 10, length: 9000 },
                Region { offset: 20000, length: BS },
                Region { offset: 40960, length: 8192 },
            ],
            vec![Region { offset: 30 * BS, length: 12 * BS }],
            vec![Region { offset: 0, length: 1 << 20 }],
            vec![Region { offset: 5 * BS, length: 3 * BS + 1 }, Region { offset: 0, length: 1 }],
        ];
        for regions in cases {
            let (lengths, back) =
                c.read(1, obj, &regions).await.unwrap_or_else(|e| panic!("chunk {chunk_len} {regions:?}: {e}"));
            assert_eq!(lengths.iter().sum::<u64>(), back.len() as u64);
            assert_eq!(back, expected(&data, &regions), "chunk {chunk_len} {regions:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rot_on_disk_is_caught_by_the_client() {
    let mut d = start(256 * 1024).await;
    let (obj, _) = d.client.create(1).await.unwrap();
    let data = vec![0x5au8; (16 * BS) as usize];
    d.client.write(1, obj, &[Region { offset: 0, length: data.len() as u64 }], &data).await.unwrap();
    d.client.flush(1, &[obj]).await.unwrap();
    d.rot(obj, 3, 17, 0x5a ^ 0xa5);

    // Plain INTEGRITY_DATA: the drive checks the stored digest and refuses.
    let auth = d.client.auth().clone();
    d.client.set_auth(Auth::new(auth.credential.clone(), Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA)));
    let err = d.client.read(1, obj, &[Region { offset: 0, length: 16 * BS }]).await.unwrap_err();
    assert_eq!(err.status(), Some(Status::DataCorrupted), "{err}");

    // Hash-and-MAC: the drive sends the stored digest without rechecking; the
    // client's digest of the rotten block differs, so the tag fails.
    d.client.set_auth(Auth::new(auth.credential.clone(), hash_and_mac()));
    let err = d.client.read(1, obj, &[Region { offset: 0, length: 16 * BS }]).await.unwrap_err();
    assert!(matches!(err, ClientError::HashAndMacMismatch(_)), "{err}");
    // A reply that failed its check leaves the connection unusable: reconnect.
    d.client = DriveClient::connect(d.addr).await.unwrap();
    d.client.set_auth(Auth::new(auth.credential.clone(), hash_and_mac()));

    // Hash-and-MAC reading the rotten block only in part: its stored digest
    // does not travel (the drive hashes the part it sends), so the drive
    // checks the block itself and refuses — whether the rotten byte is in
    // the part sent or not.
    for region in [
        Region { offset: 3 * BS + 10, length: 20 },
        Region { offset: 3 * BS + 100, length: BS },
        Region { offset: 2 * BS + 5, length: BS },
        Region { offset: 0, length: 4 * BS - 1 },
    ] {
        let err = d.client.read(1, obj, &[region]).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::DataCorrupted), "{region:?}: {err}");
    }
    // Two regions each taking part of the rotten block, and whole blocks
    // around it: refused.
    let regions = [
        Region { offset: 3 * BS + 1, length: 5 },
        Region { offset: 3 * BS + 6, length: 10 },
        Region { offset: 4 * BS, length: BS },
    ];
    let err = d.client.read(1, obj, &regions).await.unwrap_err();
    assert_eq!(err.status(), Some(Status::DataCorrupted), "{err}");
    // Blocks without rot still read, whole or in part.
    let (_, back) = d.client.read(1, obj, &[Region { offset: 4 * BS + 3, length: 2 * BS }]).await.unwrap();
    assert_eq!(back, vec![0x5au8; (2 * BS) as usize]);
}

/// Rot in a whole block that straddles reply chunks. The drive cannot send
/// such a block's stored digest (it stands for the whole block, and a chunk
/// ends inside it), so it hashes the block on the fly — and must check that
/// hash against the stored digest before any chunk holding the block goes
/// out, since under Hash-and-MAC the store does not check whole blocks.
/// Chunks smaller than a block (every block straddles), of two and four
/// blocks with unaligned offsets (some blocks straddle, others travel by
/// stored digest); rot at the start, middle and end of blocks: the client
/// never accepts the rotten byte, hands over only true bytes before it, and
/// fails with one of the documented errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rot_in_blocks_straddling_chunks_never_reaches_the_client() {
    const BLOCKS: u64 = 12;
    let mut refused_before_reply = 0;
    for chunk_len in [1024u32, 1000, 8192, 16384] {
        let mut d = start(chunk_len).await;
        let (obj, _) = d.client.create(1).await.unwrap();
        let data: Vec<u8> = (0..BLOCKS * BS).map(|i| (i * 29 % 251) as u8 | 1).collect();
        d.client.write(1, obj, &[Region { offset: 0, length: data.len() as u64 }], &data).await.unwrap();
        d.client.flush(1, &[obj]).await.unwrap();
        for (block, at) in [(0, 0), (0, 3000), (2, 0), (2, 2100), (3, BS - 1), (5, 1), (6, 2048), (11, BS - 1)] {
            d.rot(obj, block, at, 0x40);
            let rotten = block * BS + at;
            for offset in [0, 100, BS - 1, 2 * BS + 5] {
                if offset > rotten {
                    continue;
                }
                let region = Region { offset, length: BLOCKS * BS - offset };
                let mut c = d.connect(hash_and_mac()).await;
                let mut got = Vec::new();
                let r = c.read_to(1, obj, &[region], &mut got).await;
                let case = format!("chunk {chunk_len}, rot at {block}:{at}, read from {offset}");
                let handed = offset + got.len() as u64;
                assert!(handed <= rotten, "{case}: the client handed over the rotten byte ({r:?})");
                assert!(got == data[offset as usize..handed as usize], "{case}: bytes handed over differ");
                match &r {
                    Err(ClientError::Status { status: Status::DataCorrupted, .. }) => {
                        assert!(got.is_empty());
                        refused_before_reply += 1;
                    }
                    Err(ClientError::HashAndMacMismatch(_)) => {}
                    Err(ClientError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
                    other => panic!("{case}: {other:?}"),
                }
                if chunk_len < BS as u32 {
                    // No stored digest travels: the drive itself refused.
                    assert!(!matches!(r, Err(ClientError::HashAndMacMismatch(_))), "{case}");
                }
            }
            d.rot(obj, block, at, 0x40);
        }
        // Repaired (the rot undone): every read succeeds again.
        let mut c = d.connect(hash_and_mac()).await;
        let (_, back) = c.read(1, obj, &[Region { offset: 100, length: BLOCKS * BS }]).await.unwrap();
        assert!(back == data[100..]);
        // Rot the drive found is audited as DATA_CORRUPTED.
        let trail = d.client.read_audit(&d.drive_key, 0, 512).await.unwrap();
        assert!(trail.iter().any(|r| r.opcode == nasd_proto::opcode::READ && r.status == Status::DataCorrupted as u16));
    }
    assert!(refused_before_reply > 0, "rot in the first chunk's blocks is refused with DATA_CORRUPTED");
}

/// SCRUB over the network (`DriveClient::scrub` under the drive key against
/// a running drive): rot injected into blocks.dat is reported by partition,
/// object and logical block, each physical block is checked once however
/// many clones map it, `max_report` bounds the list but not the total, and
/// reads of a rotten block fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrub_over_the_network_reports_rot() {
    let mut d = start(256 * 1024).await;
    let c = &mut d.client;
    let (a, _) = c.create(1).await.unwrap();
    let data: Vec<u8> = (0..10 * BS).map(|i| (i % 241) as u8).collect();
    c.write(1, a, &[Region { offset: 0, length: 10 * BS }], &data).await.unwrap();
    let (clone, _) = c.fastcopy(1, a).await.unwrap();
    let (b, _) = c.create(1).await.unwrap();
    c.write(1, b, &[Region { offset: 0, length: 5 * BS }], &data[..(5 * BS) as usize]).await.unwrap();
    c.flush(1, &[a, clone, b]).await.unwrap();
    let key = d.drive_key.clone();
    assert_eq!(c.scrub(&key, 16).await.unwrap(), (15, 0, vec![]), "clean: 15 physical blocks, shared ones once");

    d.rot(a, 3, 100, 0x01);
    d.rot(b, 1, 0, 0x80);
    d.rot(b, 4, BS - 1, 0x10);
    let (checked, total, mut listed) = d.client.scrub(&key, 16).await.unwrap();
    assert_eq!((checked, total), (15, 3));
    listed.sort();
    let a_or_clone = listed.iter().find(|r| r.2 == 3).expect("block 3 of a (or its clone) listed").1;
    assert!(a_or_clone == a || a_or_clone == clone);
    assert!(listed.contains(&(1, b, 1)) && listed.contains(&(1, b, 4)) && listed.len() == 3, "{listed:?}");
    let (_, total, listed) = d.client.scrub(&key, 1).await.unwrap();
    assert_eq!((total, listed.len()), (3, 1), "max_report bounds the list, not the count");
    let err = d.client.scrub(&key, nasd_proto::limits::SCRUB_REPORT_MAX as u16 + 1).await.unwrap_err();
    assert_eq!(err.status(), Some(Status::LimitExceeded));

    // Reads of a rotten block fail: the drive refuses under per-byte MACs;
    // under Hash-and-MAC the client's check of the stored digest fails.
    let mut c = d.connect(Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA)).await;
    for object in [a, clone] {
        let err = c.read(1, object, &[Region { offset: 3 * BS, length: BS }]).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::DataCorrupted), "{err}");
    }
    let (_, back) = c.read(1, clone, &[Region { offset: 4 * BS, length: 6 * BS }]).await.unwrap();
    assert!(back == data[(4 * BS) as usize..], "blocks without rot still read");
    let mut c = d.connect(hash_and_mac()).await;
    let err = c.read(1, b, &[Region { offset: 0, length: 5 * BS }]).await.unwrap_err();
    assert!(matches!(err, ClientError::HashAndMacMismatch(_)), "{err}");
}
