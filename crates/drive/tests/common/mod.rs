//! A drive with security enforced on a tempdir store, restartable on the same
//! directory, with two partitions and every key of the hierarchy set — for
//! the tests of partition-class operations (`txn.rs`, `map_epoch.rs`).
#![allow(dead_code)]

use nasd_client::{Auth, ClientError, Credential, DriveClient};
use nasd_crypto::{mint_capability, Key, MacAlgorithm};
use nasd_drive::{DriveConfig, SecurityMode};
use nasd_proto::{rights, CapabilityArgs, Protection, Region, Status};
use nasd_store::{Store, StoreOptions};
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const BS: u64 = 4096;
pub const P: u64 = 1;
pub const OTHER: u64 = 2;
pub const PROTECTION: Protection = Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA);

pub fn rg(offset: u64, length: u64) -> Region {
    Region { offset, length }
}

pub fn bytes(seed: u8, len: u64) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect()
}

/// The status of a refusal; anything else fails the test.
#[track_caller]
pub fn refused<T: std::fmt::Debug>(r: Result<T, ClientError>) -> Status {
    match r {
        Err(ClientError::Status { status, .. }) => status,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// How [`Drive::start_with`] sets a drive up.
#[derive(Clone)]
pub struct Options {
    pub block_size: u32,
    pub capacity_bytes: u64,
    /// Each partition's quota.
    pub quota_bytes: u64,
    /// Changes to the drive's configuration (time-outs).
    pub config: fn(&mut DriveConfig),
    /// Where the drive counts (kept across restarts).
    pub metrics: nasd_drive::DriveMetrics,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            block_size: BS as u32,
            capacity_bytes: 256 << 20,
            quota_bytes: 64 << 20,
            config: |_| {},
            metrics: Default::default(),
        }
    }
}

/// A secured drive on a tempdir store, restartable on the same directory,
/// with partitions 1 and 2 and every key of the hierarchy set.
pub struct Drive {
    pub dir: tempfile::TempDir,
    pub addr: SocketAddr,
    pub master: Key,
    pub drive_key: Key,
    pub partition_keys: [Key; 2],
    pub working: Key,
    pub stop: Option<(oneshot::Sender<()>, JoinHandle<std::io::Result<()>>)>,
    pub store: Weak<Store>,
    pub options: Options,
}

impl Drive {
    pub async fn start() -> Drive {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(options: Options) -> Drive {
        let mut d = Drive {
            dir: tempfile::tempdir().unwrap(),
            addr: "127.0.0.1:1".parse().unwrap(),
            master: Key::random(),
            drive_key: Key::random(),
            partition_keys: [Key::random(), Key::random()],
            working: Key::random(),
            stop: None,
            store: Weak::new(),
            options,
        };
        d.serve().await;
        let mut c = DriveClient::connect(d.addr).await.unwrap();
        c.set_drive_key(&d.master, &d.drive_key).await.unwrap();
        c.set_auth(Auth::new(Credential::Drive(d.drive_key.clone()), PROTECTION));
        for (i, p) in [P, OTHER].into_iter().enumerate() {
            c.create_partition(p).await.unwrap();
            c.resize_partition(p, d.options.quota_bytes).await.unwrap();
            c.set_partition_key(&d.drive_key, p, &d.partition_keys[i]).await.unwrap();
        }
        c.set_working_key(&d.partition_keys[0], P, 1, &d.working).await.unwrap();
        d
    }

    pub async fn serve(&mut self) {
        let opts = StoreOptions {
            block_size: self.options.block_size,
            capacity_bytes: self.options.capacity_bytes,
            ..Default::default()
        };
        let store = Arc::new(Store::open(self.dir.path(), &opts).unwrap());
        self.store = Arc::downgrade(&store);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        self.addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let mut config = DriveConfig {
            commit_interval: Duration::from_secs(3600),
            security: SecurityMode::Enforced { master_key: Some(self.master.clone()) },
            metrics: self.options.metrics.clone(),
            ..DriveConfig::default()
        };
        (self.options.config)(&mut config);
        let server = tokio::spawn(nasd_drive::serve(listener, store, config, async move {
            let _ = rx.await;
        }));
        self.stop = Some((tx, server));
    }

    /// Stops the drive gracefully (its final commit) and serves the same
    /// directory again. The caller drops its clients first.
    pub async fn restart(&mut self) {
        let (tx, server) = self.stop.take().expect("running");
        let _ = tx.send(());
        server.await.unwrap().unwrap();
        // Connection tasks drop their handle on the store when they see EOF.
        tokio::time::timeout(Duration::from_secs(20), async {
            while self.store.strong_count() > 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await
        .expect("the store closes");
        self.serve().await;
    }

    pub async fn client(&self, credential: Credential) -> DriveClient {
        let mut c = DriveClient::connect(self.addr).await.unwrap();
        c.set_auth(Auth::new(credential, PROTECTION));
        c
    }

    pub async fn admin(&self) -> DriveClient {
        self.client(Credential::Drive(self.drive_key.clone())).await
    }

    /// Capability arguments for `object` (0: the whole partition) of
    /// partition `P` with every right, under working key version 1.
    pub fn capability_args(drive_id: [u8; 16], object: u64) -> CapabilityArgs {
        CapabilityArgs {
            algorithm: MacAlgorithm::Blake3 as u8,
            min_protection: Protection::INTEGRITY_ARGS,
            key_version: 1,
            drive_id,
            partition: P,
            object,
            region: CapabilityArgs::WHOLE_OBJECT,
            access_control_version: 0,
            rights: rights::ALL,
            map_epoch: 0,
            expiration_ns: u64::MAX,
            audit_id: 77,
        }
    }

    /// A capability minted from `args` with `working`.
    pub fn mint(working: &Key, args: &CapabilityArgs) -> Credential {
        let (token, key) = mint_capability(working, args, false).unwrap();
        Credential::Capability { token, key, algorithm: MacAlgorithm::Blake3 }
    }

    /// A capability for `object` (0: the whole partition) of `P` with every right.
    pub fn capability(&self, drive_id: [u8; 16], object: u64) -> Credential {
        Self::mint(&self.working, &Self::capability_args(drive_id, object))
    }
}
