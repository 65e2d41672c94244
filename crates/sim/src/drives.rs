//! The drive-level world: secured drives, an administrator that provisions
//! them and mints capabilities (the file manager's part, in process), and
//! clients that talk to the drives directly — under faults drawn from the
//! seed, with every read checked against the objects' models.
//!
//! What is checked, continuously:
//! - every read returns a state the object's acknowledged history allows
//!   ([`ObjectModel`]): after a crash, the last flushed state or a later one,
//!   never an older one, never a mix; without a crash, exactly the current
//!   state (or the one an unanswered write may have installed);
//! - no request sent after a revocation of its capability returned is
//!   accepted (the administrator bumps access-control versions at random,
//!   and re-applies them to a restarted drive before it readmits it), nor
//!   one under a capability whose working key was retired (the
//!   administrator rotates drives' working keys at random; a drive keeps
//!   the current and the previous one, so the install of version `v`
//!   retires `v - 2`; a rotation a drive did not acknowledge is installed
//!   before its readmission);
//! - rot is reported (`DATA_CORRUPTED`, a failed Hash-and-MAC tag), never
//!   served, and only where the disk rotted;
//! - requests that replay another connection's bytes change nothing (the
//!   models above would see it);
//! - every audit record a drive returned (`READ_AUDIT` persists before it
//!   reads) is still in its trail, unchanged, after every crash;
//! - clock offsets within the configured skew refuse nothing; no drive task
//!   panics (a drive aborts the process: the panic hook reports the seed);
//!   every drive opens again after every crash.
//!
//! And at the end, with the faults stopped: every partition's space adds up
//! (its usage within its quota, and the usage and object count the drive
//! kept through the run the ones it counts again from its disk after a
//! flush and a crash), and every object reads back as its model says.

use crate::model::ObjectModel;
use crate::world::{between, jump_a_clock, reset_a_connection, slow_a_link, Core, Host, Node, Tally};
use crate::Config;
use nasd_client::{Auth, ClientError, Credential, DriveClient};
use nasd_crypto::{mint_capability, Key, MacAlgorithm};
use nasd_drive::{DriveConfig, SecurityMode};
use nasd_proto::{rights, AttrMask, Attributes, CapabilityArgs, Protection, Region, Status};
use nasd_store::{Store, StoreOptions};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// The partition every object lives in.
const PARTITION: u64 = 1;
/// The map epoch the administrator sets: a restarted drive refuses
/// capabilities until it is set again (readmission).
const MAP_EPOCH: u32 = 1;
/// Block size of the simulated drives.
const BLOCK_SIZE: u32 = 4096;
/// Block storage of each drive.
const DRIVE_CAPACITY_BYTES: u64 = 16 << 20;
/// Each simulated disk (block file, metadata, audit trail).
const DISK_BYTES: u64 = 48 << 20;
/// Largest object the clients make.
const OBJECT_BYTES_MAX: u64 = 40 * 1024;
/// Largest write.
const WRITE_BYTES_MAX: u64 = 12 * 1024;
/// How long a capability lives.
const CAPABILITY_LIFETIME: Duration = Duration::from_secs(120);
/// How long a client waits for a drive at any step.
const CLIENT_WAIT: Duration = Duration::from_secs(20);
/// The drives' port.
const DRIVE_PORT: u16 = 7400;
/// Where the store lives on a drive's disk.
const STORE_DIR: &str = "/drive";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().expect("scenario mutex poisoned")
}

fn drive_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 10, i as u8 + 1))
}
fn client_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 20, i as u8 + 1))
}
const ADMIN_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 30, 1));
const EVE_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 50, 1));

/// The keys of one drive's hierarchy, held by the administrator.
struct DriveKeys {
    master: Key,
    drive: Key,
    partition: Key,
    /// The working key capabilities are minted with, by version: the one
    /// the drive acknowledged last.
    working: Mutex<(u32, Key)>,
    /// A rotation whose install the drive did not acknowledge (it went
    /// down): installed again before the drive is readmitted.
    pending: Mutex<Option<(u32, Key)>>,
    /// Working-key versions the drive acknowledged, with when.
    rotations: Mutex<Vec<(u32, Instant)>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DriveState {
    Up,
    Down,
    Gone,
}

struct DriveSlot {
    index: usize,
    host: Arc<Host>,
    addr: SocketAddr,
    keys: DriveKeys,
    node: Mutex<Option<Arc<Node>>>,
    state: Mutex<DriveState>,
    drive_id: Mutex<[u8; 16]>,
    /// The disk rotted: reads may fail with DATA_CORRUPTED.
    rotted: AtomicBool,
    serving: Mutex<Option<tokio::task::JoinHandle<std::io::Result<()>>>>,
    /// Audit records the drive returned, by sequence (durable once returned).
    audited: Mutex<BTreeMap<u64, nasd_proto::AuditRecord>>,
}

struct ObjectSlot {
    drive: usize,
    id: u64,
    model: Mutex<ObjectModel>,
    /// The access-control version the administrator set last.
    acv: AtomicU64,
    /// Revocations that returned: the version set and when it returned.
    revoked: Mutex<Vec<(u64, Instant)>>,
}

/// The world of one run.
pub struct Scenario {
    core: Arc<Core>,
    cfg: Config,
    drives: Vec<DriveSlot>,
    objects: Mutex<Vec<Arc<ObjectSlot>>>,
    admin: Arc<Node>,
    clients: Vec<Arc<Host>>,
    tally: Tally,
    end: Instant,
}

impl Scenario {
    /// Builds the hosts of a run (inside its runtime).
    pub fn new(core: Arc<Core>, cfg: Config) -> Arc<Scenario> {
        let key = |core: &Core| Key::from_bytes(core.bytes(32).try_into().expect("32 bytes"));
        let drives = (0..cfg.drives)
            .map(|i| DriveSlot {
                index: i,
                host: Host::new(&core, &format!("drive-{i}"), drive_ip(i), DISK_BYTES),
                addr: SocketAddr::new(drive_ip(i), DRIVE_PORT),
                keys: DriveKeys {
                    master: key(&core),
                    drive: key(&core),
                    partition: key(&core),
                    working: Mutex::new((1, key(&core))),
                    pending: Mutex::new(None),
                    rotations: Mutex::new(Vec::new()),
                },
                node: Mutex::new(None),
                state: Mutex::new(DriveState::Down),
                drive_id: Mutex::new([0; 16]),
                rotted: AtomicBool::new(false),
                serving: Mutex::new(None),
                audited: Mutex::new(BTreeMap::new()),
            })
            .collect();
        let admin = Host::new(&core, "admin", ADMIN_IP, 1 << 20).boot();
        let clients =
            (0..cfg.clients).map(|i| Host::new(&core, &format!("client-{i}"), client_ip(i), 1 << 20)).collect();
        let end = Instant::now() + cfg.duration;
        Arc::new(Scenario {
            core,
            cfg,
            drives,
            objects: Mutex::new(Vec::new()),
            admin,
            clients,
            tally: Tally::default(),
            end,
        })
    }

    /// A property broke: logged, and the run fails.
    fn fail(&self, what: String) {
        self.tally.fail(&self.core, what);
    }

    /// The failures so far.
    pub fn failures(&self) -> Vec<String> {
        self.tally.failures()
    }

    /// Requests the clients sent, and faults injected.
    pub fn counts(&self) -> (u64, u64) {
        self.tally.counts()
    }

    /// The whole run: start and provision the drives, run the clients, the
    /// administrator's revocations and the faults until the end, stop the
    /// faults, bring every drive back and check every object.
    pub async fn run(self: Arc<Self>) {
        for d in &self.drives {
            if let Err(e) = self.start_drive(d).await {
                self.fail(format!("drive-{} did not start: {e}", d.index));
                return;
            }
            if let Err(e) = self.provision(d).await {
                self.fail(format!("drive-{} could not be provisioned: {e}", d.index));
                return;
            }
        }
        if let Err(e) = self.create_objects().await {
            self.fail(format!("objects could not be made: {e}"));
            return;
        }
        let mut tasks = Vec::new();
        for c in 0..self.clients.len() {
            let s = self.clone();
            tasks.push(tokio::spawn(async move { s.client(c).await }));
        }
        let s = self.clone();
        tasks.push(tokio::spawn(async move { s.revoker().await }));
        let s = self.clone();
        tasks.push(tokio::spawn(async move { s.auditor().await }));
        if self.cfg.faults {
            let s = self.clone();
            tasks.push(tokio::spawn(async move { s.faults().await }));
        }
        for t in tasks {
            if let Err(e) = t.await {
                self.fail(format!("a simulation task failed: {e}"));
            }
        }
        self.quiesce().await;
        self.final_check().await;
    }

    // ------------------------------------------------------------ drives

    async fn start_drive(&self, d: &DriveSlot) -> Result<(), String> {
        let node = d.host.boot();
        let env = node.env();
        let opts = StoreOptions { block_size: BLOCK_SIZE, capacity_bytes: DRIVE_CAPACITY_BYTES, ..Default::default() };
        let store = Store::open_in(&env, Path::new(STORE_DIR), &opts).map_err(|e| format!("store: {e}"))?;
        let listener = env.bind(d.addr).await.map_err(|e| format!("listen: {e}"))?;
        let config = DriveConfig {
            commit_interval: Duration::from_secs(2),
            security: SecurityMode::Enforced { master_key: Some(d.keys.master.clone()) },
            ..DriveConfig::default()
        };
        let serving = env.spawn(nasd_drive::serve(listener, Arc::new(store), config, std::future::pending()));
        *lock(&d.serving) = Some(serving);
        *lock(&d.node) = Some(node);
        *lock(&d.state) = DriveState::Up;
        self.core.log(format!("drive-{} up", d.index));
        Ok(())
    }

    fn crash_drive(&self, d: &DriveSlot, why: &str) {
        let Some(node) = lock(&d.node).take() else { return };
        *lock(&d.state) = DriveState::Down;
        if let Some(serving) = lock(&d.serving).take() {
            if serving.is_finished() {
                self.fail(format!("drive-{} stopped serving before its crash", d.index));
            }
        }
        let lost = node.crash();
        self.core.log(format!("drive-{} crashed ({why})", d.index));
        for line in lost {
            self.core.log(format!("drive-{} disk: {line}", d.index));
        }
        for o in lock(&self.objects).iter().filter(|o| o.drive == d.index) {
            lock(&o.model).drive_crashed();
        }
    }

    async fn admin_client(&self, d: &DriveSlot) -> Result<DriveClient, ClientError> {
        let env = self.admin.env();
        let mut c = DriveClient::connect_in(&env, d.addr, CLIENT_WAIT).await?;
        let key = Credential::Partition { partition: PARTITION, key: d.keys.partition.clone() };
        c.set_auth(Auth::new(key, Protection::INTEGRITY_ARGS));
        Ok(c)
    }

    /// First boot: keys, the partition, and the map epoch that makes a
    /// restarted drive wait for readmission.
    async fn provision(&self, d: &DriveSlot) -> Result<(), ClientError> {
        let env = self.admin.env();
        let mut c = DriveClient::connect_in(&env, d.addr, CLIENT_WAIT).await?;
        *lock(&d.drive_id) = c.drive_id();
        c.set_drive_key(&d.keys.master, &d.keys.drive).await?;
        c.set_auth(Auth::new(Credential::Drive(d.keys.drive.clone()), Protection::INTEGRITY_ARGS));
        c.create_partition(PARTITION).await?;
        c.resize_partition(PARTITION, DRIVE_CAPACITY_BYTES).await?;
        c.set_partition_key(&d.keys.drive, PARTITION, &d.keys.partition).await?;
        let (version, working) = lock(&d.keys.working).clone();
        c.set_working_key(&d.keys.partition, PARTITION, version, &working).await?;
        c.set_map_epoch(PARTITION, MAP_EPOCH).await?;
        Ok(())
    }

    async fn create_objects(&self) -> Result<(), ClientError> {
        let n = self.cfg.clients * self.cfg.objects_per_client;
        for k in 0..n {
            let drive = k % self.drives.len();
            let mut c = self.admin_client(&self.drives[drive]).await?;
            let (id, _) = c.create(PARTITION).await?;
            c.flush(PARTITION, &[id]).await?;
            lock(&self.objects).push(Arc::new(ObjectSlot {
                drive,
                id,
                model: Mutex::new(ObjectModel::new()),
                acv: AtomicU64::new(0),
                revoked: Mutex::new(Vec::new()),
            }));
        }
        Ok(())
    }

    /// After a restart, as the file manager does: every object's
    /// access-control version set again (a revocation not yet committed when
    /// the drive crashed is not lost), then the partition readmitted.
    async fn readmit(&self, d: &DriveSlot) {
        loop {
            match self.try_readmit(d).await {
                Ok(()) => {
                    self.core.log(format!("drive-{} readmitted", d.index));
                    return;
                }
                Err(e) => {
                    if *lock(&d.state) != DriveState::Up {
                        return;
                    }
                    self.core.log(format!("drive-{} readmission failed: {e}", d.index));
                    if matches!(e, ClientError::Status { status: Status::IoError, .. }) {
                        // Its store failed (a full disk at a commit): the operator restarts it.
                        self.crash_drive(d, "restarted by its operator: its store failed");
                        if let Err(e) = self.start_drive(d).await {
                            self.fail(format!("drive-{} did not open again after a crash: {e}", d.index));
                            *lock(&d.state) = DriveState::Gone;
                            return;
                        }
                        continue;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    async fn try_readmit(&self, d: &DriveSlot) -> Result<(), ClientError> {
        let mut c = self.admin_client(d).await?;
        let objects: Vec<_> = lock(&self.objects).iter().filter(|o| o.drive == d.index).cloned().collect();
        for o in objects {
            let acv = o.acv.load(Ordering::Acquire);
            let attrs = Attributes { access_control_version: acv, ..Default::default() };
            c.setattr(PARTITION, o.id, AttrMask::ACCESS_CONTROL_VERSION, &attrs).await?;
        }
        let pending = lock(&d.keys.pending).clone();
        if let Some((version, key)) = pending {
            self.install_working_key(&mut c, d, version, &key).await?;
        }
        c.set_map_epoch(PARTITION, MAP_EPOCH).await
    }

    /// A capability for `o` with every right, at the administrator's current
    /// version, under the current working key: with that version and the
    /// key's.
    fn capability(&self, o: &ObjectSlot) -> (Credential, u64, u32) {
        let d = &self.drives[o.drive];
        let acv = o.acv.load(Ordering::Acquire);
        let (key_version, working) = lock(&d.keys.working).clone();
        let args = CapabilityArgs {
            algorithm: MacAlgorithm::Blake3 as u8,
            min_protection: Protection::INTEGRITY_ARGS,
            key_version,
            drive_id: *lock(&d.drive_id),
            partition: PARTITION,
            object: o.id,
            region: CapabilityArgs::WHOLE_OBJECT,
            access_control_version: acv,
            rights: rights::ALL,
            map_epoch: MAP_EPOCH,
            expiration_ns: self.admin.host.now_ns() + CAPABILITY_LIFETIME.as_nanos() as u64,
            audit_id: o.id,
        };
        let (token, key) = mint_capability(&working, &args, false).expect("a working key mints");
        (Credential::Capability { token, key, algorithm: MacAlgorithm::Blake3 }, acv, key_version)
    }

    /// Bumps access-control versions at random, as chmod does through the
    /// manager; records when each revocation returned.
    async fn revoker(self: Arc<Self>) {
        while Instant::now() < self.end {
            tokio::time::sleep(between(&self.core, Duration::from_millis(500), Duration::from_secs(6))).await;
            let objects = lock(&self.objects).clone();
            let o = &objects[self.core.gen_range(0..objects.len() as u64) as usize];
            let d = &self.drives[o.drive];
            if *lock(&d.state) != DriveState::Up {
                continue;
            }
            if self.core.chance(0.4) {
                self.rotate_working_key(d).await;
                continue;
            }
            let next = o.acv.load(Ordering::Acquire) + 1;
            // The manager's intention: recorded before it asks the drive.
            o.acv.store(next, Ordering::Release);
            let attrs = Attributes { access_control_version: next, ..Default::default() };
            // As the manager's intention log does: again until the drive
            // answers, or it is down (its readmission sets the version).
            loop {
                let done = match self.admin_client(d).await {
                    Ok(mut c) => c.setattr(PARTITION, o.id, AttrMask::ACCESS_CONTROL_VERSION, &attrs).await,
                    Err(e) => Err(e),
                };
                match done {
                    Ok(_) => {
                        lock(&o.revoked).push((next, Instant::now()));
                        self.core.log(format!("revoked object {} on drive-{}: version {next}", o.id, o.drive));
                        break;
                    }
                    Err(e) => {
                        self.core.log(format!("revocation of object {} on drive-{} failed: {e}", o.id, o.drive));
                        // A drive down, or the end of the run: the readmission sets it.
                        if *lock(&d.state) != DriveState::Up || Instant::now() >= self.end {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                }
            }
        }
    }

    /// Rotates `d`'s working key, as the file manager does when keys age:
    /// the drive keeps the current and the previous one, so each rotation
    /// retires the key two versions back. Tried again until the drive
    /// answers, or it is down (its readmission installs the key).
    async fn rotate_working_key(&self, d: &DriveSlot) {
        let next = lock(&d.keys.working).0 + 1;
        let key = Key::from_bytes(self.core.bytes(32).try_into().expect("32 bytes"));
        *lock(&d.keys.pending) = Some((next, key.clone()));
        loop {
            let done = match self.admin_client(d).await {
                Ok(mut c) => self.install_working_key(&mut c, d, next, &key).await,
                Err(e) => Err(e),
            };
            match done {
                Ok(()) => return,
                Err(e) => {
                    self.core.log(format!("working key {next} for drive-{} not installed: {e}", d.index));
                    if *lock(&d.state) != DriveState::Up || Instant::now() >= self.end {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
    }

    /// Installs working key `version` on `d`; once the drive acknowledged
    /// it (or refuses it as not above its own: a reply lost), capabilities
    /// are minted with it, and the key two versions back is retired.
    async fn install_working_key(
        &self,
        c: &mut DriveClient,
        d: &DriveSlot,
        version: u32,
        key: &Key,
    ) -> Result<(), ClientError> {
        match c.set_working_key(&d.keys.partition, PARTITION, version, key).await {
            Ok(()) | Err(ClientError::Status { status: Status::BadArguments, .. }) => {}
            Err(e) => return Err(e),
        }
        *lock(&d.keys.working) = (version, key.clone());
        *lock(&d.keys.pending) = None;
        lock(&d.keys.rotations).push((version, Instant::now()));
        self.core.log(format!("drive-{} working key {version} installed", d.index));
        Ok(())
    }

    /// Reads the drives' audit trails now and then, remembering every record.
    async fn auditor(self: Arc<Self>) {
        while Instant::now() < self.end {
            tokio::time::sleep(between(&self.core, Duration::from_secs(2), Duration::from_secs(12))).await;
            let d = &self.drives[self.core.gen_range(0..self.drives.len() as u64) as usize];
            if *lock(&d.state) == DriveState::Up {
                let _ = self.read_audit(d, false).await;
            }
        }
    }

    /// Reads `d`'s audit trail past what was seen (from the start if
    /// `all`), checking that every record seen before is still there as it was.
    async fn read_audit(&self, d: &DriveSlot, all: bool) -> Result<(), ClientError> {
        let env = self.admin.env();
        let mut c = DriveClient::connect_in(&env, d.addr, CLIENT_WAIT).await?;
        c.set_auth(Auth::new(Credential::Drive(d.keys.drive.clone()), Protection::INTEGRITY_ARGS));
        let mut after = if all { 0 } else { lock(&d.audited).keys().next_back().copied().unwrap_or(0) };
        let seen_max = lock(&d.audited).keys().next_back().copied().unwrap_or(0);
        let mut found = 0u64;
        let page = nasd_proto::limits::AUDIT_RECORDS_PER_REPLY_MAX as u16;
        // Every READ_AUDIT is itself audited: read pages until one comes back
        // short (the end as of that read), not until one comes back empty.
        loop {
            let records = c.read_audit(&d.keys.drive, after, page).await?;
            let short = records.len() < usize::from(page);
            let Some(last) = records.last() else { break };
            after = last.sequence;
            let mut seen = lock(&d.audited);
            for r in records {
                match seen.get(&r.sequence).cloned() {
                    Some(before) if before != r => {
                        drop(seen);
                        self.fail(format!(
                            "drive-{}'s audit record {} changed after a crash: {before:?} became {r:?}",
                            d.index, r.sequence
                        ));
                        return Ok(());
                    }
                    Some(_) => found += 1,
                    None => {
                        seen.insert(r.sequence, r);
                    }
                }
            }
            if short {
                break;
            }
        }
        if all {
            let expected = lock(&d.audited).range(..=seen_max).count() as u64;
            if found < expected {
                self.fail(format!(
                    "drive-{} lost {} of the {expected} audit records it had returned before its crash",
                    d.index,
                    expected - found
                ));
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------ clients

    async fn client(self: Arc<Self>, c: usize) {
        let node = self.clients[c].boot();
        let env = node.env();
        let mine: Vec<Arc<ObjectSlot>> = lock(&self.objects)
            .iter()
            .enumerate()
            .filter(|(k, _)| k / self.cfg.objects_per_client == c)
            .map(|(_, o)| o.clone())
            .collect();
        let hash_and_mac = self.core.chance(0.5);
        let protection = if hash_and_mac {
            Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA).union(Protection::HASH_AND_MAC)
        } else {
            Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA)
        };
        let mut client = Client {
            s: self.clone(),
            name: format!("client-{c}"),
            env,
            protection,
            conns: BTreeMap::new(),
            caps: BTreeMap::new(),
            out_of_window: BTreeMap::new(),
        };
        while Instant::now() < self.end {
            let o = mine[self.core.gen_range(0..mine.len() as u64) as usize].clone();
            if *lock(&self.drives[o.drive].state) == DriveState::Gone {
                continue;
            }
            client.step(&o).await;
            tokio::time::sleep(between(&self.core, Duration::ZERO, Duration::from_millis(40))).await;
        }
    }

    // ------------------------------------------------------------ faults

    async fn faults(self: Arc<Self>) {
        let quiet = self.end - Duration::from_secs(5);
        let mut gone = false;
        while Instant::now() < quiet {
            tokio::time::sleep(between(&self.core, Duration::from_millis(500), Duration::from_secs(8))).await;
            self.tally.fault();
            let d = &self.drives[self.core.gen_range(0..self.drives.len() as u64) as usize];
            let up = *lock(&d.state) == DriveState::Up;
            match self.core.gen_range(0..100) {
                0..=17 if up => {
                    self.crash_drive(d, "kill -9");
                    tokio::time::sleep(between(&self.core, Duration::from_millis(100), Duration::from_secs(5))).await;
                    self.restart(d).await;
                }
                18..=25 if up => {
                    d.host.disk.set_full(true);
                    self.core.log(format!("drive-{} disk full", d.index));
                    tokio::time::sleep(between(&self.core, Duration::from_millis(100), Duration::from_secs(5))).await;
                    d.host.disk.set_full(false);
                    self.core.log(format!("drive-{} disk has room again", d.index));
                    self.restart_if_failed(d).await;
                }
                26..=31 if up => {
                    d.host.disk.fail_syncs(1);
                    self.core.log(format!("drive-{} next fsync fails", d.index));
                    // A store whose sync failed refuses changes until it restarts: the operator restarts it.
                    tokio::time::sleep(between(&self.core, Duration::from_secs(1), Duration::from_secs(6))).await;
                    if *lock(&d.state) == DriveState::Up {
                        self.crash_drive(d, "restarted by its operator after a failed fsync");
                        self.restart(d).await;
                    }
                }
                32..=39 => {
                    let at = d.host.disk.rot(&Path::new(STORE_DIR).join("blocks.dat"), 0);
                    if let Some(at) = at {
                        d.rotted.store(true, Ordering::Release);
                        self.core.log(format!("drive-{} rot at byte {at} of blocks.dat", d.index));
                    }
                }
                40..=54 => {
                    let c = self.core.gen_range(0..self.clients.len() as u64) as usize;
                    let long = between(&self.core, Duration::from_millis(200), Duration::from_secs(45));
                    self.core.net.partition(client_ip(c), d.host.ip);
                    self.core.log(format!("partition client-{c} | drive-{} for {long:?}", d.index));
                    tokio::time::sleep(long).await;
                    self.core.net.heal();
                    self.core.log("partitions healed");
                }
                55..=64 => {
                    let host = if self.core.chance(0.5) { d.host.ip } else { client_ip(0) };
                    slow_a_link(&self.core, host).await;
                }
                65..=76 => reset_a_connection(&self.core, d.host.ip, &format!("drive-{}", d.index)),
                77..=86 => {
                    let hosts: Vec<&Host> =
                        self.drives.iter().map(|d| &*d.host).chain(self.clients.iter().map(|c| &**c)).collect();
                    jump_a_clock(&self.core, &hosts);
                }
                87..=96 => self.replay().await,
                97..=99 if up && !gone && self.drives.len() > 1 && self.cfg.drive_loss => {
                    gone = true;
                    self.crash_drive(d, "gone for good");
                    *lock(&d.state) = DriveState::Gone;
                }
                _ => {}
            }
        }
    }

    /// As an operator would: a drive whose store failed (a commit that hit
    /// the full disk) is restarted.
    async fn restart_if_failed(&self, d: &DriveSlot) {
        if *lock(&d.state) != DriveState::Up {
            return;
        }
        let env = self.admin.env();
        let probe = match DriveClient::connect_in(&env, d.addr, CLIENT_WAIT).await {
            Ok(mut c) => {
                c.set_auth(Auth::new(Credential::Drive(d.keys.drive.clone()), Protection::INTEGRITY_ARGS));
                c.flush_partition(PARTITION).await
            }
            Err(e) => Err(e),
        };
        match probe {
            Err(ClientError::Status { status: Status::IoError, .. }) => {
                self.crash_drive(d, "restarted by its operator: its store failed");
                self.restart(d).await;
            }
            Err(e) => self.core.log(format!("drive-{} probe: {e}", d.index)),
            Ok(()) => {}
        }
    }

    async fn restart(&self, d: &DriveSlot) {
        if let Err(e) = self.start_drive(d).await {
            self.fail(format!("drive-{} did not open again after a crash: {e}", d.index));
            *lock(&d.state) = DriveState::Gone;
            return;
        }
        self.readmit(d).await;
        if let Err(e) = self.read_audit(d, true).await {
            self.core.log(format!("drive-{}'s audit trail could not be read after its restart: {e}", d.index));
        }
    }

    /// An eavesdropper replays what a client sent on one connection, on a
    /// connection of its own. Any request the drive carries out again would
    /// show in the objects' models.
    async fn replay(&self) {
        let Some((addr, bytes)) = self.core.net.recording(self.core.gen_range(0..1024) as usize) else { return };
        let eve = Host::new(&self.core, "eve", EVE_IP, 1 << 20).boot();
        let env = eve.env();
        self.core.log(format!("eve replays {} bytes to {addr}", bytes.len()));
        let Ok(stream) = env.connect(addr).await else { return };
        let (mut rd, mut wr) = stream.into_split();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let send = async {
            let _ = wr.write_all(&bytes).await;
            let _ = wr.shutdown().await;
        };
        let drain = async {
            let mut sink = vec![0u8; 64 * 1024];
            let mut got = 0usize;
            while let Ok(n) = rd.read(&mut sink).await {
                if n == 0 {
                    break;
                }
                got += n;
            }
            got
        };
        let (_, got) =
            tokio::time::timeout(Duration::from_secs(20), async { tokio::join!(send, drain) }).await.unwrap_or(((), 0));
        self.core.log(format!("eve's replay got {got} bytes back"));
    }

    /// Stops the faults: partitions healed, links at speed, disks with room,
    /// every drive not gone up and readmitted.
    async fn quiesce(&self) {
        self.core.net.heal();
        for d in &self.drives {
            self.core.net.set_slow(d.host.ip, Duration::ZERO);
            d.host.disk.set_full(false);
            d.host.disk.fail_syncs(0);
            if *lock(&d.state) == DriveState::Down {
                self.restart(d).await;
            } else {
                self.restart_if_failed(d).await;
                if *lock(&d.state) == DriveState::Up {
                    // Versions a revocation cut short by the end did not set.
                    self.readmit(d).await;
                }
            }
        }
        for c in &self.clients {
            self.core.net.set_slow(c.ip, Duration::ZERO);
        }
        self.core.log("faults stopped");
    }

    /// Every object on a drive not gone reads back as its model says.
    async fn final_check(self: &Arc<Self>) {
        let node = Host::new(&self.core, "checker", IpAddr::V4(Ipv4Addr::new(127, 0, 60, 1)), 1 << 20).boot();
        let mut checker = Client {
            s: self.clone(),
            name: "checker".into(),
            env: node.env(),
            protection: Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA),
            conns: BTreeMap::new(),
            caps: BTreeMap::new(),
            out_of_window: BTreeMap::new(),
        };
        for d in &self.drives {
            if *lock(&d.state) == DriveState::Up {
                self.check_space(d).await;
            }
        }
        let objects = lock(&self.objects).clone();
        for o in &objects {
            if *lock(&self.drives[o.drive].state) != DriveState::Up {
                continue;
            }
            let mut tries = 0;
            loop {
                match checker.read(o).await {
                    Outcome::Done | Outcome::Rot => break,
                    _ if tries >= 5 => {
                        self.fail(format!(
                            "object {} on drive-{} could not be read after the faults stopped",
                            o.id, o.drive
                        ));
                        break;
                    }
                    _ => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        }
        for d in &self.drives {
            if let Some(s) = lock(&d.serving).as_ref() {
                if s.is_finished() {
                    self.fail(format!("drive-{} stopped serving", d.index));
                }
            }
        }
        for d in &self.drives {
            let files: Vec<String> =
                d.host.disk.files().iter().map(|(p, len)| format!("{} {len}", p.display())).collect();
            self.core.log(format!("drive-{} files: {}", d.index, files.join(", ")));
        }
        self.core.log(format!("final check of {} objects done", objects.len()));
    }
}

impl Scenario {
    /// A connection to `d` authorized by its drive key.
    async fn drive_key_client(&self, d: &DriveSlot) -> Result<DriveClient, ClientError> {
        let mut c = DriveClient::connect_in(&self.admin.env(), d.addr, CLIENT_WAIT).await?;
        c.set_auth(Auth::new(Credential::Drive(d.keys.drive.clone()), Protection::INTEGRITY_ARGS));
        Ok(c)
    }

    /// The partitions `d` lists.
    async fn partitions(&self, d: &DriveSlot) -> Result<Vec<nasd_proto::PartitionInfo>, ClientError> {
        Ok(self.drive_key_client(d).await?.inquiry().await?.partitions)
    }

    /// Quotas add up on `d`: each partition's usage is within its quota, and
    /// what the drive counted request by request through the run is what it
    /// counts again from its disk once everything was flushed and it crashed.
    async fn check_space(&self, d: &DriveSlot) {
        let flushed = match self.drive_key_client(d).await {
            Ok(mut c) => c.flush_partition(PARTITION).await,
            Err(e) => Err(e),
        };
        let before = match (flushed, self.partitions(d).await) {
            (Ok(()), Ok(p)) => p,
            (Err(e), _) | (_, Err(e)) => {
                self.fail(format!("drive-{}'s space could not be read after the faults stopped: {e}", d.index));
                return;
            }
        };
        for p in before.iter().filter(|p| p.used_bytes > p.quota_bytes) {
            self.fail(format!(
                "drive-{} partition {} uses {} bytes over its quota of {}",
                d.index, p.partition, p.used_bytes, p.quota_bytes
            ));
        }
        self.crash_drive(d, "crashed after a flush: its space is counted again");
        self.restart(d).await;
        match self.partitions(d).await {
            Ok(after) if after == before => {
                self.core.log(format!("drive-{} space adds up: {after:?}", d.index));
            }
            Ok(after) => self.fail(format!(
                "drive-{}'s space does not add up: it counted {before:?} through the run, {after:?} from its disk",
                d.index
            )),
            Err(e) => self.fail(format!("drive-{}'s space could not be read after its restart: {e}", d.index)),
        }
    }
}

/// What a capability was minted under.
#[derive(Debug, Clone, Copy)]
struct Minted {
    acv: u64,
    key_version: u32,
}

/// How one request went.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Done,
    /// Refused with a status that changes nothing.
    Refused,
    /// No answer: the connection broke or timed out.
    Lost,
    /// Rot reported.
    Rot,
}

/// A client host: its connections and capabilities.
struct Client {
    s: Arc<Scenario>,
    name: String,
    env: nasd_env::Env,
    protection: Protection,
    conns: BTreeMap<usize, DriveClient>,
    /// Nonce-window refusals in a row, per drive.
    out_of_window: BTreeMap<usize, u32>,
    /// Capabilities by (drive, object): object numbers are per drive.
    caps: BTreeMap<(usize, u64), (Credential, u64, u32)>,
}

enum Op {
    Read,
    Write { offset: u64, data: Vec<u8> },
    Truncate { size: u64 },
    Flush,
}

impl Client {
    async fn step(&mut self, o: &Arc<ObjectSlot>) {
        let unsettled = lock(&o.model).unsettled();
        if unsettled {
            let _ = self.read(o).await;
            return;
        }
        let s = &self.s.core;
        let op = match s.gen_range(0..100) {
            0..=44 => {
                let offset = s.gen_range(0..OBJECT_BYTES_MAX);
                let len = s.gen_range(1..WRITE_BYTES_MAX + 1).min(OBJECT_BYTES_MAX - offset);
                Op::Write { offset, data: s.bytes(len as usize) }
            }
            45..=69 => Op::Read,
            70..=84 => Op::Flush,
            _ => Op::Truncate { size: if s.chance(0.2) { 0 } else { s.gen_range(0..OBJECT_BYTES_MAX + 1) } },
        };
        match op {
            Op::Read => {
                let _ = self.read(o).await;
            }
            Op::Write { offset, data } => self.write(o, offset, data).await,
            Op::Truncate { size } => self.truncate(o, size).await,
            Op::Flush => self.flush(o).await,
        }
    }

    /// The connection to `o`'s drive under a capability for `o`.
    async fn conn(&mut self, o: &ObjectSlot) -> Option<(&mut DriveClient, Minted)> {
        if !self.conns.contains_key(&o.drive) {
            let addr = self.s.drives[o.drive].addr;
            match DriveClient::connect_in(&self.env, addr, CLIENT_WAIT).await {
                Ok(c) => {
                    self.conns.insert(o.drive, c);
                }
                Err(e) => {
                    self.s.core.log(format!("{} cannot connect to drive-{}: {e}", self.name, o.drive));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    return None;
                }
            }
        }
        let key = (o.drive, o.id);
        if !self.caps.contains_key(&key) {
            self.caps.insert(key, self.s.capability(o));
        }
        let (cap, acv, key_version) = self.caps.get(&key).cloned().expect("just made");
        self.s.tally.request();
        let c = self.conns.get_mut(&o.drive).expect("just made");
        c.set_auth(Auth::new(cap, self.protection));
        Some((c, Minted { acv, key_version }))
    }

    /// Classifies a failed request; drops what it spoiled.
    fn failed(&mut self, o: &ObjectSlot, what: &str, e: &ClientError) -> Outcome {
        self.s.core.log(format!("{} {what} object {} on drive-{}: {e}", self.name, o.id, o.drive));
        let rotted = self.s.drives[o.drive].rotted.load(Ordering::Acquire);
        match e {
            ClientError::Status { status, .. } => match status {
                Status::AccessRevoked | Status::CapabilityExpired | Status::KeyVersionRetired => {
                    self.caps.remove(&(o.drive, o.id));
                    Outcome::Refused
                }
                Status::MapEpochMoved | Status::NoSpace | Status::QuotaExceeded | Status::IoError => Outcome::Refused,
                // Two clocks that each jumped within the skew may be twice
                // that apart from what the client learnt: it learns again
                // from this (authenticated) refusal, and the next request
                // must pass.
                Status::NonceOutsideWindow => {
                    let n = self.out_of_window.entry(o.drive).or_default();
                    *n += 1;
                    if *n > 1 {
                        self.s.fail(format!(
                            "{} {what} object {} on drive-{}: the nonce window refused it again after a clock jump within the skew",
                            self.name, o.id, o.drive
                        ));
                    }
                    Outcome::Refused
                }
                Status::DataCorrupted if rotted => Outcome::Rot,
                other => {
                    self.s.fail(format!(
                        "{} {what} object {} on drive-{}: unexpected refusal {other}: {e}",
                        self.name, o.id, o.drive
                    ));
                    Outcome::Refused
                }
            },
            ClientError::HashAndMacMismatch(_) if rotted => {
                self.conns.remove(&o.drive);
                Outcome::Rot
            }
            ClientError::Io(_) | ClientError::Broken => {
                self.conns.remove(&o.drive);
                Outcome::Lost
            }
            other => {
                self.conns.remove(&o.drive);
                self.s.fail(format!("{} {what} object {} on drive-{}: {other}", self.name, o.id, o.drive));
                Outcome::Lost
            }
        }
    }

    /// Checks that a request accepted was not sent after a revocation of
    /// its capability returned: a newer access-control version set, or a
    /// working key installed two versions past the capability's.
    fn accepted(&mut self, o: &ObjectSlot, what: &str, minted: Minted, sent: Instant) {
        self.out_of_window.remove(&o.drive);
        let Minted { acv, key_version } = minted;
        let retired = lock(&self.s.drives[o.drive].keys.rotations)
            .iter()
            .find(|(v, at)| *v >= key_version + 2 && *at <= sent)
            .copied();
        if let Some((v, at)) = retired {
            self.s.fail(format!(
                "{} {what} object {} on drive-{} under working key {key_version} was accepted, sent {:?} after working key {v} was installed",
                self.name,
                o.id,
                o.drive,
                sent - at
            ));
        }
        let revoked = lock(&o.revoked);
        if let Some((v, at)) = revoked.iter().find(|(v, at)| *v > acv && *at <= sent) {
            self.s.fail(format!(
                "{} {what} object {} on drive-{} under access-control version {acv} was accepted, sent {:?} after version {v} was set",
                self.name,
                o.id,
                o.drive,
                sent - *at
            ));
        }
    }

    async fn read(&mut self, o: &Arc<ObjectSlot>) -> Outcome {
        let Some((c, minted)) = self.conn(o).await else { return Outcome::Lost };
        let sent = Instant::now();
        let r = c.read(PARTITION, o.id, &[Region { offset: 0, length: OBJECT_BYTES_MAX }]).await;
        match r {
            Ok((_, data)) => {
                self.accepted(o, "read of", minted, sent);
                let checked = lock(&o.model).read(&data);
                if let Err(v) = checked {
                    self.s.fail(format!("{} read of object {} on drive-{}: {}", self.name, o.id, o.drive, v.0));
                    // Go on from what the drive holds.
                    let mut m = lock(&o.model);
                    *m = ObjectModel::new();
                    m.replaced(data);
                } else {
                    self.s.core.log(format!("{} read object {}: {} bytes", self.name, o.id, data.len()));
                }
                Outcome::Done
            }
            Err(e) => {
                let outcome = self.failed(o, "read of", &e);
                if outcome == Outcome::Rot {
                    // Heal: whatever the object held, make it empty, then go on.
                    self.truncate(o, 0).await;
                }
                outcome
            }
        }
    }

    async fn write(&mut self, o: &Arc<ObjectSlot>, offset: u64, data: Vec<u8>) {
        let next = ObjectModel::written(&lock(&o.model).current, offset, &data);
        let Some((c, minted)) = self.conn(o).await else { return };
        let sent = Instant::now();
        let r = c.write(PARTITION, o.id, &[Region { offset, length: data.len() as u64 }], &data).await;
        match r {
            Ok(_) => {
                self.accepted(o, "write to", minted, sent);
                self.s.core.log(format!("{} wrote object {} at {offset}: {} bytes", self.name, o.id, data.len()));
                lock(&o.model).acknowledged(next);
            }
            Err(e) => {
                if self.failed(o, "write to", &e) == Outcome::Lost {
                    lock(&o.model).unanswered(next);
                }
            }
        }
    }

    async fn truncate(&mut self, o: &Arc<ObjectSlot>, size: u64) {
        let (next, blind) = {
            let m = lock(&o.model);
            (ObjectModel::resized(&m.current, size), size == 0)
        };
        let Some((c, minted)) = self.conn(o).await else { return };
        let sent = Instant::now();
        let attrs = Attributes { logical_size: size, ..Default::default() };
        match c.setattr(PARTITION, o.id, AttrMask::LOGICAL_SIZE, &attrs).await {
            Ok(_) => {
                self.accepted(o, "truncation of", minted, sent);
                self.s.core.log(format!("{} set the size of object {} to {size}", self.name, o.id));
                let mut m = lock(&o.model);
                if blind {
                    m.replaced(next);
                } else {
                    m.acknowledged(next);
                }
            }
            Err(e) => {
                if self.failed(o, "truncation of", &e) == Outcome::Lost {
                    lock(&o.model).unanswered(next);
                }
            }
        }
    }

    async fn flush(&mut self, o: &Arc<ObjectSlot>) {
        let Some((c, minted)) = self.conn(o).await else { return };
        let sent = Instant::now();
        match c.flush(PARTITION, &[o.id]).await {
            Ok(()) => {
                self.accepted(o, "flush of", minted, sent);
                self.s.core.log(format!("{} flushed object {}", self.name, o.id));
                lock(&o.model).flushed();
            }
            Err(e) => {
                self.failed(o, "flush of", &e);
            }
        }
    }
}
