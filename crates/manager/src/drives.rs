//! The manager's side of its drives: one authenticated connection per drive,
//! the keys it holds for it, capability minting, and the few object
//! operations the manager does itself (pre-create, remove, revoke, measure,
//! truncate, list).

use crate::keys::DriveKeys;
use nasd_client::{Auth, ClientError, Credential, DriveClient, MacAlgorithm};
use nasd_crypto::{mint_capability, Key};
use nasd_proto::layout::ComponentState;
use nasd_proto::manager::ComponentAccess;
use nasd_proto::{
    rights, well_known, AttrMask, Attributes, CapabilityArgs, DriveInfo, Protection, Region, Status, ANY_OBJECT,
};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Mutex as AsyncMutex;

/// How long the manager waits for a drive to connect or answer.
pub const DRIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a drive's scrub may take (it reads every stored block).
pub const SCRUB_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

/// Most objects one `PARTITION_CONTENTS` read may list (8 bytes each): bounds
/// what orphan collection reads from a drive.
pub const PARTITION_OBJECTS_MAX: u64 = 64 * 1024 * 1024;

/// A drive the manager uses.
pub struct DriveHandle {
    /// The environment connections are made in and the local clock read
    /// from ([`DriveHandle::in_env`]).
    env: nasd_env::Env,
    /// The manager's number for it.
    pub drive: u32,
    /// Its identity (capabilities name it).
    pub drive_id: [u8; 16],
    /// Where it listens.
    pub addr: String,
    /// The file system's partition on it.
    pub partition: u64,
    /// Protection capabilities demand and the manager's own requests use.
    pub protection: Protection,
    /// Protection capabilities that allow writing demand (⊇ `protection`).
    pub write_protection: Protection,
    /// The keys, and whether the drive may lack their current working key:
    /// one lock, so minting never pairs a key with a stale flag.
    keys: Mutex<KeyState>,
    conn: AsyncMutex<Option<DriveClient>>,
    /// Drive clock minus local clock, from the last authenticated reply.
    clock_offset_ns: AtomicI64,
    /// Orphan collection has run against the drive since the manager started.
    recovered: AtomicBool,
    /// Whether the drive serves capabilities as far as the manager knows:
    /// false from a sign it may have restarted (and fenced itself) until
    /// its recovery readmitted it (`cluster.rs`, "Readmission").
    admitted: AtomicBool,
    /// The manager's connection to the drive was refused (not timed out):
    /// the drive may be restarting.
    suspect: AtomicBool,
    /// The drive may have restarted since the last maintenance pass: its
    /// recovery is due at once, whatever its backoff.
    readmission: AtomicBool,
    /// Serializes [`set_acv`](Self::set_acv)'s read-compare-write.
    acv_order: AsyncMutex<()>,
}

/// A drive's keys as the manager holds them.
struct KeyState {
    keys: DriveKeys,
    /// The drive may not have `keys.current` yet (a rotation it did not hear
    /// of, or a start before the first install): it does have
    /// `keys.previous`, as its current or previous working key.
    pending: bool,
}

impl std::fmt::Debug for DriveHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriveHandle").field("drive", &self.drive).field("addr", &self.addr).finish_non_exhaustive()
    }
}

/// A drive call failed: the status if the drive refused, else why it could
/// not be asked.
#[derive(Debug)]
pub struct DriveError(pub ClientError);

impl std::fmt::Display for DriveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl DriveError {
    /// The drive's refusal status, if it answered.
    pub fn status(&self) -> Option<Status> {
        self.0.status()
    }

    /// Whether the drive could not be reached at all: the connection was
    /// refused, or broke (a drive that died). Not a refusal, and not a
    /// drive too slow to answer in time (it may still serve clients).
    pub fn unreachable(&self) -> bool {
        use std::io::ErrorKind::*;
        match &self.0 {
            ClientError::Io(e) => {
                matches!(
                    e.kind(),
                    ConnectionRefused | ConnectionReset | ConnectionAborted | BrokenPipe | NotConnected | UnexpectedEof
                )
            }
            ClientError::Broken => true,
            _ => false,
        }
    }
}

impl From<ClientError> for DriveError {
    fn from(e: ClientError) -> Self {
        DriveError(e)
    }
}

/// `f`, failing with a time-out after [`DRIVE_TIMEOUT`]: every manager call to
/// a drive goes through it, so a drive that accepts and never answers cannot
/// hold up the manager (or the `drive_admin` lock) for longer.
pub(crate) async fn timed<T>(f: impl std::future::Future<Output = Result<T, ClientError>>) -> Result<T, ClientError> {
    tokio::time::timeout(DRIVE_TIMEOUT, f).await.unwrap_or_else(|_| {
        Err(ClientError::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, "drive did not answer in time")))
    })
}

/// Whether a call may be sent again after a failure that left no reply:
/// running it twice leaves the drive as running it once (setting an
/// attribute, flushing, reading, removing — the second removal's
/// `NO_SUCH_OBJECT` is success —, installing a working key the drive may
/// already have). Only `create` is not: a repeat would leave an orphan.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Repeat {
    Safe,
    Never,
}

/// Runs one call on the drive's connection, connecting first if there is
/// none or the pooled one is no longer reusable (the drive closed it after
/// its idle timeout: `DriveClient::is_reusable`). A `Repeat::Safe` call
/// that fails on a reused connection without an answer (the drive closed
/// it just as the call went out) is sent once more on a fresh connection;
/// one that timed out is not (the drive is slow, not gone).
/// Drops the connection if the call left it unusable.
macro_rules! on_drive {
    ($self:ident, $repeat:expr, |$c:ident| $call:expr) => {{
        let mut slot = $self.conn.lock().await;
        let mut attempt = 0;
        loop {
            attempt += 1;
            if slot.as_ref().is_some_and(|c| !c.is_reusable()) {
                *slot = None;
            }
            let reused = slot.is_some();
            if slot.is_none() {
                match $self.connect().await {
                    Ok(c) => {
                        // Refused or broken before, answering now: it may have restarted.
                        if $self.suspect.swap(false, Ordering::SeqCst) {
                            $self.readmission_due();
                        }
                        *slot = Some(c);
                    }
                    Err(e) => {
                        if !matches!(&e, ClientError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut) {
                            $self.suspect.store(true, Ordering::SeqCst);
                        }
                        return Err(DriveError(e));
                    }
                }
            }
            let $c = slot.as_mut().expect("connected above");
            let r = timed($call).await;
            let offset = ($c.drive_time_ns() as i128 - $self.local_ns() as i128).clamp(i64::MIN as i128, i64::MAX as i128);
            $self.clock_offset_ns.store(offset as i64, Ordering::Relaxed);
            let unanswered = matches!(&r, Err(e) if e.status().is_none());
            if unanswered {
                *slot = None;
            }
            let timed_out = matches!(&r, Err(ClientError::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut);
            if unanswered && !timed_out && reused && attempt == 1 && $repeat == Repeat::Safe {
                tracing::debug!(drive = $self.drive, "a pooled drive connection failed; trying a fresh one");
                continue;
            }
            break r.map_err(DriveError);
        }
    }};
}

impl DriveHandle {
    /// The same handle in `env` (the manager's).
    pub fn in_env(mut self, env: &nasd_env::Env) -> Self {
        self.env = env.clone();
        self
    }

    /// The local wall clock.
    fn local_ns(&self) -> i64 {
        self.env.now_ns().min(i64::MAX as u64) as i64
    }

    /// A handle for a drive set up earlier.
    pub fn new(
        drive: u32,
        drive_id: [u8; 16],
        addr: String,
        partition: u64,
        protection: Protection,
        write_protection: Protection,
        keys: DriveKeys,
    ) -> Self {
        DriveHandle {
            env: nasd_env::Env::real(),
            drive,
            drive_id,
            addr,
            partition,
            protection,
            write_protection: write_protection.union(protection),
            keys: Mutex::new(KeyState { keys, pending: true }),
            conn: AsyncMutex::new(None),
            clock_offset_ns: AtomicI64::new(0),
            recovered: AtomicBool::new(false),
            admitted: AtomicBool::new(true),
            suspect: AtomicBool::new(false),
            readmission: AtomicBool::new(false),
            acv_order: AsyncMutex::new(()),
        }
    }

    /// A copy of the keys.
    pub fn keys(&self) -> DriveKeys {
        self.keys.lock().expect("keys lock").keys.clone()
    }

    /// Replaces the keys (after a rotation); the drive has to be told.
    pub fn set_keys(&self, keys: DriveKeys) {
        *self.keys.lock().expect("keys lock") = KeyState { keys, pending: true };
    }

    /// Replaces the keys with ones whose current working key the drive has
    /// confirmed already.
    pub fn set_keys_installed(&self, keys: DriveKeys) {
        *self.keys.lock().expect("keys lock") = KeyState { keys, pending: false };
    }

    /// True until the drive has confirmed the recorded current working key.
    pub fn key_pending(&self) -> bool {
        self.keys.lock().expect("keys lock").pending
    }

    /// The working key capabilities are minted with, and its version: the
    /// current one once the drive has confirmed it; until then the previous
    /// one, which the drive holds either way (as its current key if it
    /// never heard of the rotation, as its previous key if it did), so a
    /// capability works whether or not the install has landed. Before the
    /// first rotation there is no previous key and the current one is the
    /// one the drive was set up with.
    pub fn minting_key(&self) -> (u32, Key) {
        let state = self.keys.lock().expect("keys lock");
        let k = &state.keys;
        if state.pending && k.previous.0 != 0 {
            k.previous.clone()
        } else {
            k.current.clone()
        }
    }

    /// True once recovery (orphan collection) has run against the drive.
    pub fn recovered(&self) -> bool {
        self.recovered.load(Ordering::SeqCst)
    }

    /// Records that recovery has run (or was not needed: a fresh drive).
    pub fn set_recovered(&self) {
        self.recovered.store(true, Ordering::SeqCst);
    }

    /// Asks for recovery (orphan collection) on the next maintenance pass:
    /// something may have left unrecorded objects on the drive.
    pub fn set_unrecovered(&self) {
        self.recovered.store(false, Ordering::SeqCst);
    }

    /// Whether the drive serves capabilities (not fenced after a restart),
    /// as far as the manager knows.
    pub fn admitted(&self) -> bool {
        self.admitted.load(Ordering::SeqCst)
    }

    /// Records that the drive was readmitted (true), or may have restarted
    /// and be fenced until it is (false).
    pub fn set_admitted(&self, admitted: bool) {
        self.admitted.store(admitted, Ordering::SeqCst);
    }

    /// The drive may have restarted (and fenced itself): not served to
    /// clients, and recovered — which readmits it — at the next maintenance
    /// pass whatever its backoff.
    pub fn readmission_due(&self) {
        self.set_unrecovered();
        self.set_admitted(false);
        self.readmission.store(true, Ordering::SeqCst);
    }

    /// Whether a readmission was due since the last call.
    pub(crate) fn take_readmission(&self) -> bool {
        self.readmission.swap(false, Ordering::SeqCst)
    }

    async fn connect(&self) -> Result<DriveClient, ClientError> {
        let mut c = timed(DriveClient::connect_in(&self.env, self.addr.as_str(), nasd_client::DRIVE_WAIT_MAX)).await?;
        if c.drive_id() != self.drive_id {
            return Err(ClientError::Protocol(format!(
                "the drive at {} is not drive {} (its identity changed): refusing to use it",
                self.addr, self.drive
            )));
        }
        // The drive key: the manager also flushes whole partitions, which
        // only the drive key authorizes.
        let credential = Credential::Drive(self.keys().drive);
        c.set_auth(Auth::new(credential, self.protection.union(Protection::INTEGRITY_ARGS)));
        Ok(c)
    }

    /// The manager's estimate of the drive's clock, in nanoseconds.
    pub fn drive_now_ns(&self) -> u64 {
        (self.local_ns() + self.clock_offset_ns.load(Ordering::Relaxed)).max(0) as u64
    }

    /// The least protection a capability with `rights` demands: a write
    /// capability's covers data integrity unless the administrator lowered it.
    pub fn min_protection(&self, rights: u32) -> Protection {
        if rights & (rights::WRITE | rights::APPEND) != 0 {
            self.write_protection
        } else {
            self.protection
        }
    }

    /// Mints a capability for `object` with `rights`, valid for `lifetime`,
    /// as one component's access (the caller sets the component's state).
    pub fn mint(
        &self,
        object: u64,
        acv: u64,
        rights: u32,
        lifetime: Duration,
        audit_id: u64,
        map_epoch: u32,
    ) -> ComponentAccess {
        let (key_version, working) = self.minting_key();
        let min_protection = self.min_protection(rights);
        let args = CapabilityArgs {
            algorithm: MacAlgorithm::Blake3 as u8,
            min_protection,
            key_version,
            drive_id: self.drive_id,
            partition: self.partition,
            object,
            region: CapabilityArgs::WHOLE_OBJECT,
            access_control_version: acv,
            rights,
            map_epoch,
            expiration_ns: self.drive_now_ns().saturating_add(lifetime.as_nanos() as u64),
            audit_id,
        };
        let (token, key) = mint_capability(&working, &args, false).expect("capability arguments are valid");
        ComponentAccess {
            object: nasd_proto::fs::ObjectRef { drive: self.drive, partition: self.partition, object },
            state: ComponentState::Ok,
            drive_addr: self.addr.clone(),
            drive_id: self.drive_id,
            token,
            key: *key.expose(),
        }
    }

    /// One component's binding without a capability (an empty token and a
    /// zero key): on a partition whose scheme accepts PALs only, a client
    /// reaches `object` under its identity, so nothing is minted.
    pub fn binding(&self, object: u64) -> ComponentAccess {
        ComponentAccess {
            object: nasd_proto::fs::ObjectRef { drive: self.drive, partition: self.partition, object },
            state: ComponentState::Ok,
            drive_addr: self.addr.clone(),
            drive_id: self.drive_id,
            token: Vec::new(),
            key: [0; 32],
        }
    }

    /// Identity, capacity and use.
    pub async fn inquiry(&self) -> Result<DriveInfo, DriveError> {
        on_drive!(self, Repeat::Safe, |c| c.inquiry())
    }

    /// Creates `n` empty objects and makes them durable; returns their ids.
    pub async fn create_objects(&self, n: usize) -> Result<Vec<u64>, DriveError> {
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            ids.push(on_drive!(self, Repeat::Never, |c| c.create(self.partition))?.0);
        }
        self.flush().await?;
        Ok(ids)
    }

    /// Removes an object; an object already gone is not an error.
    pub async fn remove(&self, object: u64) -> Result<(), DriveError> {
        match on_drive!(self, Repeat::Safe, |c| c.remove(self.partition, object)) {
            Err(e) if e.status() == Some(Status::NoSuchObject) => Ok(()),
            r => r,
        }
    }

    /// Raises an object's access control version to `acv` (revoking every
    /// capability minted with a lower one); a drive already at `acv` or above
    /// is left alone. Access control versions only grow, and the same object
    /// can be revoked by a request and by the maintenance pass finishing an
    /// older intent at once: setting blindly could let the older value land
    /// last, bringing revoked capabilities back and refusing current ones.
    /// An object already gone is not an error.
    pub async fn set_acv(&self, object: u64, acv: u64) -> Result<(), DriveError> {
        let _order = self.acv_order.lock().await;
        let current = match self.getattr(object).await {
            Err(e) if e.status() == Some(Status::NoSuchObject) => return Ok(()),
            r => r?.access_control_version,
        };
        if current >= acv {
            return Ok(());
        }
        let attrs = Attributes { access_control_version: acv, ..Default::default() };
        match on_drive!(self, Repeat::Safe, |c| c.setattr(
            self.partition,
            object,
            AttrMask::ACCESS_CONTROL_VERSION,
            &attrs
        )) {
            Err(e) if e.status() == Some(Status::NoSuchObject) => Ok(()),
            r => r.map(|_| ()),
        }
    }

    /// An object's attributes.
    pub async fn getattr(&self, object: u64) -> Result<Attributes, DriveError> {
        on_drive!(self, Repeat::Safe, |c| c.getattr(self.partition, object))
    }

    /// Sets an object's length (truncate or extend with zeros).
    pub async fn set_size(&self, object: u64, size: u64) -> Result<Attributes, DriveError> {
        let attrs = Attributes { logical_size: size, ..Default::default() };
        on_drive!(self, Repeat::Safe, |c| c.setattr(self.partition, object, AttrMask::LOGICAL_SIZE, &attrs))
    }

    /// Makes everything in the partition durable.
    pub async fn flush(&self) -> Result<(), DriveError> {
        on_drive!(self, Repeat::Safe, |c| c.flush_partition(self.partition))
    }

    /// Makes `objects` durable. If one is gone already, flushes the whole
    /// partition instead, which makes its removal durable too.
    pub async fn flush_objects(&self, objects: &[u64]) -> Result<(), DriveError> {
        match on_drive!(self, Repeat::Safe, |c| c.flush(self.partition, objects)) {
            Err(e) if e.status() == Some(Status::NoSuchObject) => self.flush().await,
            r => r,
        }
    }

    /// Every ordinary object in the partition (from `PARTITION_CONTENTS`).
    pub async fn list_objects(&self) -> Result<Vec<u64>, DriveError> {
        let contents = well_known::PARTITION_CONTENTS;
        let len = self.getattr(contents).await?.logical_size.min(PARTITION_OBJECTS_MAX * 8);
        if len == 0 {
            return Ok(Vec::new());
        }
        let region = Region { offset: 0, length: len };
        let (_, bytes) = on_drive!(self, Repeat::Safe, |c| c.read(self.partition, contents, &[region]))?;
        Ok(bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .filter(|&id| id >= well_known::FIRST_USER_OBJECT)
            .collect())
    }

    /// Opens write transaction `txn` on `object` (see the coordinator).
    pub async fn txn_begin(&self, object: u64, txn: u64) -> Result<(), DriveError> {
        on_drive!(self, Repeat::Safe, |c| c.txn_begin(self.partition, object, txn))
    }

    /// Ends write transaction `txn` on `object`, committing or rolling back;
    /// whether it was open. An object already gone is not an error.
    pub async fn txn_end(&self, object: u64, txn: u64, commit: bool) -> Result<bool, DriveError> {
        match on_drive!(self, Repeat::Safe, |c| c.txn_end(self.partition, object, txn, commit)) {
            Err(e) if e.status() == Some(Status::NoSuchObject) => Ok(false),
            r => r,
        }
    }

    /// Open write transactions on objects above `after`, ascending by
    /// object, at most `max`: (object, txn, begun).
    pub async fn txn_list(&self, after: u64, max: u16) -> Result<Vec<(u64, u64, u64)>, DriveError> {
        let txns = on_drive!(self, Repeat::Safe, |c| c.txn_list(self.partition, after, max))?;
        Ok(txns.into_iter().map(|t| (t.object, t.txn, t.begun_ns)).collect())
    }

    /// Raises the partition's minimum cluster map epoch: capabilities minted
    /// under an older one are refused with `MAP_EPOCH_MOVED`.
    pub async fn set_map_epoch(&self, epoch: u32) -> Result<(), DriveError> {
        on_drive!(self, Repeat::Safe, |c| c.set_map_epoch(self.partition, epoch))
    }

    /// `len` bytes of `object` at `offset` (fewer past its end).
    pub async fn read(&self, object: u64, offset: u64, len: u64) -> Result<Vec<u8>, DriveError> {
        let region = Region { offset, length: len };
        Ok(on_drive!(self, Repeat::Safe, |c| c.read(self.partition, object, &[region]))?.1)
    }

    /// Writes `data` at `offset` of `object`.
    pub async fn write(&self, object: u64, offset: u64, data: &[u8]) -> Result<(), DriveError> {
        if data.is_empty() {
            return Ok(());
        }
        let region = Region { offset, length: data.len() as u64 };
        on_drive!(self, Repeat::Safe, |c| c.write(self.partition, object, &[region], data)).map(|_| ())
    }

    /// Checks every stored block against its digest: (blocks checked,
    /// corrupt blocks of the partition as (partition, object, block), at
    /// most `max_report`). On a connection of its own, bounded by
    /// [`SCRUB_TIMEOUT`]: a scrub reads the whole drive, and the manager's
    /// working connection must stay free meanwhile.
    pub async fn scrub(&self, max_report: u16) -> Result<(u64, Vec<(u64, u64, u64)>), DriveError> {
        let drive_key = self.keys().drive;
        let scrub = async {
            let mut c = self.connect().await?;
            c.scrub(&drive_key, max_report).await
        };
        let (checked, _, corrupt) = tokio::time::timeout(SCRUB_TIMEOUT, scrub).await.unwrap_or_else(|_| {
            Err(ClientError::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, "scrub did not finish in time")))
        })?;
        Ok((checked, corrupt.into_iter().filter(|(p, _, _)| *p == self.partition).collect()))
    }

    /// The drive's block size.
    pub async fn block_size(&self) -> Result<u32, DriveError> {
        Ok(self.inquiry().await?.block_size)
    }

    /// Makes `keys.current` the drive's current working key. A drive that
    /// already has that version (the manager stopped after telling it) is fine.
    pub async fn install_working_key(&self, keys: &DriveKeys) -> Result<(), DriveError> {
        let (version, key) = &keys.current;
        let r = on_drive!(self, Repeat::Safe, |c| c.set_working_key(&keys.partition, self.partition, *version, key));
        match r {
            Ok(()) => {}
            // The drive refuses versions not above its current one: it has this key already.
            Err(e) if e.status() == Some(Status::BadArguments) => {}
            Err(e) => return Err(e),
        }
        let mut state = self.keys.lock().expect("keys lock");
        if state.keys.current.0 == *version {
            state.pending = false;
        }
        Ok(())
    }

    /// Installs shared identity key `key_id` (DSFS) on the drive. A drive
    /// that has it, or a higher id, already refuses with `BAD_ARGUMENTS`:
    /// fine, ids only grow.
    pub async fn set_identity_key(&self, key_id: u32, key: &Key) -> Result<(), DriveError> {
        let drive_key = self.keys().drive.clone();
        match on_drive!(self, Repeat::Safe, |c| c.set_identity_key(&drive_key, key_id, key)) {
            Err(e) if e.status() == Some(Status::BadArguments) => Ok(()),
            r => r,
        }
    }

    /// Replaces an object's access PAL (under the drive key; durable when it
    /// returns). An object already gone is not an error.
    pub async fn set_pal(&self, object: u64, pal: &nasd_proto::ObjectPal) -> Result<(), DriveError> {
        match on_drive!(self, Repeat::Safe, |c| c.set_pal(self.partition, object, pal)) {
            Err(e) if e.status() == Some(Status::NoSuchObject) => Ok(()),
            r => r,
        }
    }

    /// Replaces PAL collection `collection`'s super PAL (under the drive key;
    /// durable when it returns); an empty one makes the drive forget it.
    pub async fn set_super_pal(&self, collection: u64, pal: &nasd_proto::Pal) -> Result<(), DriveError> {
        on_drive!(self, Repeat::Safe, |c| c.set_super_pal(self.partition, collection, pal))
    }

    /// Sets which credentials the file system's partition accepts.
    pub async fn set_auth_scheme(&self, scheme: nasd_proto::AuthScheme) -> Result<(), DriveError> {
        on_drive!(self, Repeat::Safe, |c| c.set_auth_scheme(self.partition, scheme))
    }

    /// Retires identity key `key_id` on the drive. One it never had (an
    /// id above every one installed there) is `BAD_ARGUMENTS`: nothing to retire.
    pub async fn retire_identity_key(&self, key_id: u32) -> Result<(), DriveError> {
        let drive_key = self.keys().drive.clone();
        match on_drive!(self, Repeat::Safe, |c| c.retire_identity_key(&drive_key, key_id)) {
            Err(e) if e.status() == Some(Status::BadArguments) => Ok(()),
            r => r,
        }
    }

    /// Sets up a fresh drive reached by `client` (authorized by its master
    /// key): sets the clock, a new drive key, the partition with `quota`,
    /// its partition key, working key 1 and minimum protection.
    pub async fn provision(
        client: &mut DriveClient,
        master: &Key,
        keys: &DriveKeys,
        partition: u64,
        quota: u64,
        protection: Protection,
    ) -> Result<(), DriveError> {
        // Clock 0 keeps the drive's own (NTP-synchronized) clock: a clock set
        // from here would lag by the network delay, and clients stamping
        // nonces with their own clocks would be refused as "ahead".
        timed(client.initialize(master, None, 0, nasd_store_skew())).await?;
        timed(client.set_drive_key(master, &keys.drive)).await?;
        let drive = Credential::Drive(keys.drive.clone());
        client.set_auth(Auth::new(drive.clone(), nasd_client::key_management_protection()));
        timed(client.create_partition(partition)).await?;
        timed(client.resize_partition(partition, quota)).await?;
        timed(client.set_partition_key(&keys.drive, partition, &keys.partition)).await?;
        let (version, working) = &keys.current;
        timed(client.set_working_key(&keys.partition, partition, *version, working)).await?;
        timed(client.set_min_protection(&drive, partition, protection)).await?;
        Ok(())
    }
}

/// The nonce window the manager gives drives: 5 s either side.
fn nasd_store_skew() -> u64 {
    5_000_000_000
}

/// Capability rights for reading a file's object.
pub const READ_RIGHTS: u32 = rights::READ | rights::GETATTR;
/// Capability rights for writing a file's object (no attribute changes:
/// truncation and revocation go through the manager).
pub const WRITE_RIGHTS: u32 = rights::WRITE | rights::FLUSH | rights::GETATTR;

/// Capability rights for reading a file's attributes only (`stat` of a file
/// the caller may not read).
pub const ATTR_RIGHTS: u32 = rights::GETATTR;

const _: () = assert!(ANY_OBJECT == 0);
