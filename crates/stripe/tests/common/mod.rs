//! Real drives on loopback for the striping tests: each drive is
//! `nasd_drive::serve` over a real `nasd_store::Store` in a temporary
//! directory, with security enforced, on a tokio runtime of its own — so
//! stopping a drive (shutting its runtime down) drops its listener and every
//! connection at once, as a crashed drive would.

#![allow(dead_code)]

use nasd_client::{Auth, Credential, DriveClient, Key, MacAlgorithm};
use nasd_drive::{DriveConfig, SecurityMode};
use nasd_proto::layout::{ComponentState, Layout};
use nasd_proto::{rights, CapabilityArgs, Protection, Region};
use nasd_store::{Store, StoreOptions};
use nasd_stripe::{Binding, DrivePool, Options, StaticBinder, Striper, Target};
use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

/// Block size of the test drives (small, so that tests rot single blocks).
pub const BLOCK_BYTES: u64 = 4096;
/// Longest any one step may take before the test fails (a hang, not a
/// timing assertion).
pub const STEP: Duration = Duration::from_secs(120);
/// The partition every test object lives in.
pub const PARTITION: u64 = 1;

/// Fails the test if `f` takes longer than [`STEP`].
pub async fn to<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(STEP, f).await.expect("step timed out: a drive or the engine hung")
}

/// Runs a scenario on a multi-threaded runtime of its own (from a thread
/// with a large stack: unoptimized async frames are big).
pub fn run<F: Future<Output = ()> + Send + 'static>(scenario: F) {
    std::thread::Builder::new()
        .stack_size(32 * 1024 * 1024)
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(scenario);
        })
        .unwrap()
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
}

/// Deterministic bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5DEE_CE66_D1CE_4E5B;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// One drive.
pub struct Drive {
    pub number: u32,
    pub addr: SocketAddr,
    pub drive_id: [u8; 16],
    pub drive_key: Key,
    pub working: Key,
    pub store: Arc<Store>,
    rt: Option<tokio::runtime::Runtime>,
    _dir: tempfile::TempDir,
}

impl Drive {
    /// Starts a drive with security enforced and provisions it: drive key,
    /// partition 1 with a quota, its partition key and working key 1.
    pub async fn start(number: u32) -> Drive {
        let dir = tempfile::tempdir().unwrap();
        let opts = StoreOptions { block_size: BLOCK_BYTES as u32, capacity_bytes: 512 << 20, ..Default::default() };
        let store = Arc::new(Store::open(dir.path(), &opts).unwrap());
        let master = Key::random();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let config =
            DriveConfig { security: SecurityMode::Enforced { master_key: Some(master.clone()) }, ..Default::default() };
        let s = store.clone();
        rt.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let _ = nasd_drive::serve(listener, s, config, std::future::pending()).await;
        });
        let mut c = to(DriveClient::connect(addr)).await.unwrap();
        let (drive_key, part_key, working) = (Key::random(), Key::random(), Key::random());
        to(c.set_drive_key(&master, &drive_key)).await.unwrap();
        c.set_auth(Auth::new(Credential::Drive(drive_key.clone()), Protection::INTEGRITY_ARGS));
        to(c.create_partition(PARTITION)).await.unwrap();
        to(c.resize_partition(PARTITION, 256 << 20)).await.unwrap();
        to(c.set_partition_key(&drive_key, PARTITION, &part_key)).await.unwrap();
        to(c.set_working_key(&part_key, PARTITION, 1, &working)).await.unwrap();
        let drive_id = c.drive_id();
        Drive { number, addr, drive_id, drive_key, working, store, rt: Some(rt), _dir: dir }
    }

    /// A connection under the drive key.
    pub async fn admin(&self) -> DriveClient {
        let mut c = to(DriveClient::connect(self.addr)).await.unwrap();
        c.set_auth(Auth::new(Credential::Drive(self.drive_key.clone()), Protection::INTEGRITY_ARGS));
        c
    }

    /// Creates an object in partition 1.
    pub async fn create(&self) -> u64 {
        to(self.admin().await.create(PARTITION)).await.unwrap().0
    }

    /// An object's bytes `[offset, offset + len)` as the drive holds them
    /// (zeros past its end).
    pub async fn raw(&self, object: u64, offset: u64, len: u64) -> Vec<u8> {
        let mut out = vec![0u8; len as usize];
        if len == 0 {
            return out;
        }
        let (_, data) =
            to(self.admin().await.read(PARTITION, object, &[Region { offset, length: len }])).await.unwrap();
        out[..data.len()].copy_from_slice(&data);
        out
    }

    /// A capability for `object` with `rights`, valid for `lifetime` from now
    /// (or expired `lifetime` ago with `expired`).
    pub fn capability(&self, object: u64, rights: u32, lifetime: Duration, expired: bool) -> Credential {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        let expiration_ns = if expired { now - lifetime.as_nanos() as u64 } else { now + lifetime.as_nanos() as u64 };
        let args = CapabilityArgs {
            algorithm: MacAlgorithm::Blake3 as u8,
            min_protection: Protection::INTEGRITY_ARGS,
            key_version: 1,
            drive_id: self.drive_id,
            partition: PARTITION,
            object,
            region: CapabilityArgs::WHOLE_OBJECT,
            access_control_version: self.store.access_control_version(PARTITION, object).unwrap(),
            rights,
            expiration_ns,
            audit_id: 7,
            map_epoch: 0,
        };
        let (token, key) = nasd_crypto::mint_capability(&self.working, &args, false).unwrap();
        Credential::Capability { token, key, algorithm: MacAlgorithm::Blake3 }
    }

    /// XORs `mask` into byte `at` of logical block `block` of `object` on the media.
    pub fn rot(&self, object: u64, block: u64, at: u64, mask: u8) {
        let map = self.store.block_map(PARTITION, object).unwrap();
        let phys = map.iter().find(|(l, _)| *l == block).expect("the block is stored").1.phys;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(self.store.dir().join("blocks.dat")).unwrap();
        let mut byte = [0u8; 1];
        f.read_exact_at(&mut byte, phys * BLOCK_BYTES + at).unwrap();
        f.write_all_at(&[byte[0] ^ mask], phys * BLOCK_BYTES + at).unwrap();
    }

    /// Stops the drive: its listener and every connection close at once.
    pub fn stop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }

    pub fn running(&self) -> bool {
        self.rt.is_some()
    }
}

impl Drop for Drive {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How a target's requests are authorized.
#[derive(Debug, Clone, Copy)]
pub enum Cred {
    /// The drive key (as the manager does).
    DriveKey,
    /// A capability with every right, requests under this protection.
    Capability(Protection),
}

/// Protection of capability tests: per-byte integrity plus Hash-and-MAC
/// reads, so a rotten block fails the client's check.
pub fn hash_and_mac() -> Protection {
    Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA).union(Protection::HASH_AND_MAC)
}

/// Drives and the pool the tests' engines share.
pub struct Cluster {
    pub drives: Vec<Drive>,
    pub pool: Arc<DrivePool>,
}

impl Cluster {
    pub async fn start(n: usize) -> Cluster {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("NASD_LOG")
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
            )
            .with_test_writer()
            .try_init();
        let mut drives = Vec::new();
        for i in 0..n {
            drives.push(Drive::start(i as u32 + 1).await);
        }
        Cluster { drives, pool: Arc::new(DrivePool::new()) }
    }

    /// A binding of a new object on drive `d`.
    pub async fn bind(&self, d: usize, cred: Cred) -> Binding {
        let drive = &self.drives[d];
        let object = drive.create().await;
        let auth = match cred {
            Cred::DriveKey => Auth::new(Credential::Drive(drive.drive_key.clone()), Protection::INTEGRITY_ARGS),
            Cred::Capability(p) => {
                Auth::new(drive.capability(object, rights::ALL, Duration::from_secs(3600), false), p)
            }
        };
        Binding {
            drive: drive.number,
            addr: drive.addr.to_string(),
            drive_id: drive.drive_id,
            partition: PARTITION,
            object,
            auth,
            state: ComponentState::Ok,
        }
    }

    /// A target of `layout` with new objects, component `i` on drive `first + i`.
    pub async fn target(&self, layout: &str, first: usize, cred: Cred) -> Target {
        let layout = Layout::parse(layout).unwrap();
        let mut components = Vec::new();
        for i in 0..layout.components() {
            components.push(self.bind((first + i) % self.drives.len(), cred).await);
        }
        Target { layout, components }
    }

    /// An engine over `target` with this cluster's pool.
    pub fn striper(&self, target: Target, options: Options) -> Striper {
        Striper::with_options(self.pool.clone(), Arc::new(StaticBinder::new(target).unwrap()), options).unwrap()
    }

    /// The drive index holding `binding`.
    pub fn drive_of(&self, binding: &Binding) -> usize {
        self.drives.iter().position(|d| d.number == binding.drive).unwrap()
    }
}

/// Options with small batches, so that small files cross many batches.
pub fn small_batches() -> Options {
    Options { batch_bytes: 64 * 1024, ..Options::default() }
}
