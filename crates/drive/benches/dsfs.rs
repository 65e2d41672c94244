//! Identity (DSFS) against capability verification on the drive, for 4 KiB
//! reads, measured in **interleaved rounds** so that the noise of a shared
//! machine falls on every case alike (BENCHMARKS.md reports ratios to the
//! capability case of the same round).
//!
//! 1. Verification alone, in process: everything the drive does to a
//!    `READ` of 4 KiB before it runs it — parse the frame, checks 1–8 (key,
//!    digest, protection, nonce), decode the arguments, checks 11–12
//!    (capability checks, or the identity checks with the PAL match) — under
//!    a capability whose key is cached (the common case), a new capability
//!    each time (one more MAC), an identity matched in a PAL of 2 entries,
//!    and an identity matched last in a full super PAL after a full access
//!    PAL that does not name it (the most an identity check reads).
//! 2. The same reads end to end over loopback: a real drive (in process,
//!    security enforced) and one `DriveClient` per case, each read a full
//!    round trip; p50 latency per case per round.
//!
//! Run: `cargo bench -p nasd-drive --bench dsfs` (`DSFS_ROUNDS`,
//! `DSFS_BATCH`, `DSFS_READS` change the round count, frames per case per
//! round, and reads per case per round).

mod fixture;

use fixture::{capability, fixture, frame, identity_frame, verify_and_authorize, Fixture};
use nasd_client::{Auth, Credential, DriveClient};
use nasd_crypto::{identity_key, mint_capability, Key, MacAlgorithm};
use nasd_drive::{DriveConfig, SecurityMode};
use nasd_proto::{
    rights, AuthScheme, CapabilityArgs, IdentityData, ObjectPal, Pal, PalEntry, Principal, Protection, Region,
};
use nasd_store::{Store, StoreOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

/// The cases of part 1: a name and how to build one frame.
type Build = Box<dyn Fn(&Fixture, u64) -> Vec<u8>>;

fn verification(rounds: usize, batch: usize) {
    let f = fixture();
    let warm = capability(&f, 7);
    let last_role = 100 + nasd_proto::limits::PAL_ENTRIES_MAX as u32 - 1;
    let cases: Vec<(&str, Build)> = vec![
        ("capability, key cached", Box::new(move |f, _| frame(f, &warm).0)),
        ("capability, key not cached", Box::new(|f, i| frame(f, &capability(f, 1_000_000 + i)).0)),
        ("identity, PAL of 2 entries", Box::new(|f, _| identity_frame(f, 0, 16).0)),
        ("identity, full PAL + super PAL", Box::new(move |f, _| identity_frame(f, last_role, 17).0)),
    ];
    // Warm up every path once.
    for (_, build) in &cases {
        verify_and_authorize(&f, &build(&f, 0));
    }
    let mut per_op: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut serial = 0u64;
    for round in 0..rounds {
        let mut this = vec![0.0; cases.len()];
        // Rotate the order so no case always runs first (or last) in a round.
        for k in 0..cases.len() {
            let c = (k + round) % cases.len();
            let frames: Vec<Vec<u8>> = (0..batch)
                .map(|_| {
                    serial += 1;
                    (cases[c].1)(&f, serial)
                })
                .collect();
            let start = Instant::now();
            for bytes in &frames {
                verify_and_authorize(&f, bytes);
            }
            this[c] = start.elapsed().as_nanos() as f64 / batch as f64;
        }
        for c in 0..cases.len() {
            per_op[c].push(this[c]);
            ratios[c].push(this[c] / this[0]);
        }
    }
    println!("\n### Verification of a 4 KiB READ on the drive ({rounds} rounds × {batch} requests per case)\n");
    println!("| case | median ns per request | requests/s on one core | median ratio to capability, key cached (same round) |");
    println!("|---|---|---|---|");
    for (c, (name, _)) in cases.iter().enumerate() {
        let ns = median(per_op[c].clone());
        println!("| {name} | {ns:.0} | {:.0} | {:.2} |", 1e9 / ns, median(ratios[c].clone()));
    }
}

/// A drive on loopback with one object of 4 KiB readable under a
/// capability and, by its PAL, under an identity; the two clients.
async fn loopback() -> (tempfile::TempDir, DriveClient, DriveClient, tokio::sync::oneshot::Sender<()>) {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions { block_size: 4096, capacity_bytes: 64 << 20, ..StoreOptions::default() };
    let store = Arc::new(Store::open(dir.path(), &opts).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let master = Key::random();
    let config = DriveConfig {
        commit_interval: Duration::from_secs(3600),
        security: SecurityMode::Enforced { master_key: Some(master.clone()) },
        ..DriveConfig::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(nasd_drive::serve(listener, store, config, async {
        let _ = stopped.await;
    }));
    let (drive_key, part_key, working, shared) = (Key::random(), Key::random(), Key::random(), Key::random());
    let protection = Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA);
    let mut admin = DriveClient::connect(addr).await.unwrap();
    admin.set_drive_key(&master, &drive_key).await.unwrap();
    admin.set_auth(Auth::new(Credential::Drive(drive_key.clone()), protection));
    admin.create_partition(1).await.unwrap();
    admin.resize_partition(1, 16 << 20).await.unwrap();
    admin.set_partition_key(&drive_key, 1, &part_key).await.unwrap();
    admin.set_working_key(&part_key, 1, 1, &working).await.unwrap();
    admin.set_identity_key(&drive_key, 1, &shared).await.unwrap();
    admin.set_auth_scheme(1, AuthScheme::BOTH).await.unwrap();
    let (o, _) = admin.create(1).await.unwrap();
    admin.write(1, o, &[Region { offset: 0, length: 4096 }], &[7u8; 4096]).await.unwrap();
    let read = rights::READ | rights::GETATTR;
    let entries = vec![PalEntry { principal: Principal::User(1000), rights: read }];
    admin.set_pal(1, o, &ObjectPal { collection: 0, pal: Pal::new(entries) }).await.unwrap();
    let args = CapabilityArgs {
        algorithm: MacAlgorithm::Blake3 as u8,
        min_protection: Protection::INTEGRITY_ARGS,
        key_version: 1,
        drive_id: admin.drive_id(),
        partition: 1,
        object: o,
        region: CapabilityArgs::WHOLE_OBJECT,
        access_control_version: 0,
        rights: read,
        map_epoch: 0,
        expiration_ns: u64::MAX,
        audit_id: 1,
    };
    let (token, key) = mint_capability(&working, &args, false).unwrap();
    let mut cap = DriveClient::connect(addr).await.unwrap();
    cap.set_auth(Auth::new(Credential::Capability { token, key, algorithm: MacAlgorithm::Blake3 }, protection));
    let data =
        IdentityData { algorithm: MacAlgorithm::Blake3 as u8, key_id: 1, user: 1000, role: 0, expiration_ns: u64::MAX };
    let idkey = identity_key(&shared, &data).unwrap();
    let mut id = DriveClient::connect(addr).await.unwrap();
    id.set_auth(Auth::new(Credential::Identity { data, key: idkey }, protection));
    assert_eq!(o, 16);
    (dir, cap, id, stop)
}

fn reads(rounds: usize, reads: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let (_dir, cap, id, stop) = loopback().await;
        let mut clients = [("capability", cap), ("identity", id)];
        let region = [Region { offset: 0, length: 4096 }];
        for (_, c) in clients.iter_mut() {
            for _ in 0..100 {
                c.read(1, 16, &region).await.unwrap();
            }
        }
        let mut p50: Vec<Vec<f64>> = vec![Vec::new(); clients.len()];
        let mut ratios = Vec::new();
        for round in 0..rounds {
            let mut this = vec![0.0; clients.len()];
            for k in 0..clients.len() {
                let c = (k + round) % clients.len();
                let mut lat = Vec::with_capacity(reads);
                for _ in 0..reads {
                    let start = Instant::now();
                    let (_, bytes) = clients[c].1.read(1, 16, &region).await.unwrap();
                    lat.push(start.elapsed().as_nanos() as f64 / 1000.0);
                    assert_eq!(bytes.len(), 4096);
                }
                this[c] = median(lat);
            }
            p50[0].push(this[0]);
            p50[1].push(this[1]);
            ratios.push(this[1] / this[0]);
        }
        println!("\n### 4 KiB reads over loopback ({rounds} rounds × {reads} reads per credential, INTEGRITY_ARGS | INTEGRITY_DATA)\n");
        println!("| credential | median of per-round p50 µs | median ratio to capability (same round) |");
        println!("|---|---|---|");
        println!("| capability | {:.1} | 1.00 |", median(p50[0].clone()));
        println!("| identity (PAL of 1 entry) | {:.1} | {:.2} |", median(p50[1].clone()), median(ratios));
        let _ = stop.send(());
    });
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this too, briefly.
    let quick = !std::env::args().any(|a| a == "--bench");
    let (rounds, batch, n) = if quick { (2, 200, 50) } else { (16, 5000, 2000) };
    verification(env("DSFS_ROUNDS", rounds), env("DSFS_BATCH", batch));
    reads(env("DSFS_ROUNDS", rounds), env("DSFS_READS", n));
}
