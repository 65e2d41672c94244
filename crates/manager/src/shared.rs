//! What several managers on one database share, and how: the database is
//! the only shared state. Work only one manager may do at a time runs under
//! a lease row ([`nasd_meta::Lease`]); what a manager caches from the
//! database (the drive table and keys, the map epoch, drives out of
//! service, users' credentials) is read again on every maintenance pass
//! ([`Manager::refresh_shared`]). Managers sharing a database share
//! `manager.key` too (the drive keys in the database are sealed with it,
//! and file handles derive from it and the database's `file_system_id`, set
//! once with `Namespace::setting_or_insert`, so managers starting together
//! agree).
//!
//! | State | Where | Why correct with several managers |
//! |---|---|---|
//! | Names, inodes, layouts, components, pool, doomed and ACV logs, write intents, quotas, users | their tables | every operation is one serializable transaction (on PostgreSQL, one that conflicts runs again): two managers' renames, links and creates of one name serialize like one manager's |
//! | A file's size and permission changes (`SETATTR` but of times only, truncating `CREATE`) and its small writes (`WRITE_SMALL`) | lease `inode/N` (shared database only), beside the in-process stripe lock (`Manager::inode_lock`) | held from the permission check through the drives' size change to the commit, so no other manager's chmod or small write lands between; a dead holder's lease lapses after [`INODE_LEASE_TTL`] and waiters ([`INODE_LEASE_WAIT_MAX`]) take it over |
//! | Pool refill, orphan collection, key rotation of drive D | lease `drive/D` ([`DRIVE_LEASE_TTL`]), beside the in-process `drive_admin` lock | fenced (below), so correctness does not depend on clocks |
//! | Objects taken for a repair | reservation rows `object/D/P/O` ([`RESERVATION_TTL`]) | taken from the pool and reserved in one transaction; `known_objects` reads files, pool, doomed and live reservations in one transaction; a dead repairer's reservation lapses and its object becomes an orphan |
//! | PAL pushes of one file or collection | lease `pal/INO` or `superpal/INO`, beside a striped lock (`Manager::pal_turn`); retries under the lease `pals` | each push reads what to set only once it holds the turn, so an older list never lands after a newer one |
//! | Drive table, working keys, out-of-service set, map epoch | cache per manager, read again every pass | a drive another manager added is attached and recovered; a key another manager rotated is taken with its install pending (minting with the previous key, which the drive holds either way, until the drive confirms the new one); rotation happens at most once per `rotate_interval` across managers, which must exceed the capability lifetime plus a maintenance pass |
//! | Users' credentials (groups, gateway grants) | counter setting [`USERS_EPOCH_SETTING`] | a change bumps it; every manager's pass reads it and makes its sessions reload their users |
//! | Routing table | setting `routing` (`crate::routing`) | compare-and-set on its version |
//! | Write transactions' rollbacks | per manager, driven by the intents table | idempotent (ACVs only rise; `TXN_END` of an ended transaction is a no-op): two managers aborting one expired intent do it twice, harmlessly |
//! | Heartbeats, health, recent placements, login and maintenance backoff | per manager | each manager's own observation; what it decides from them is a transaction |
//! | Change feed (`WATCH`) | per manager | **not shared yet**: a mount sees only changes made through its own manager; a client that fails over is told changes were lost (another incarnation) |
//!
//! **Leases** are acquired in a transaction if free, lapsed (on the
//! database's clock, one for every manager) or held by the same holder (a
//! manager's id is [`MANAGER_ID_FILE`], made once, so a restarted manager
//! takes its own leases back at once); the token moves on at every
//! acquisition. Work under a drive lease records its result only in a
//! transaction that checks the lease is still held with its token
//! (`pool_add_fenced`, `update_drive_fenced`).
//!
//! *Why orphan collection never deletes a fresh object:* collection takes
//! drive D's lease, lists the drive, then reads what the database knows. An
//! object a refill made was either recorded before the collection took the
//! lease — then it is known — or its refill lost the lease and its fence
//! fails, so it is never recorded: an orphan indeed. Lease expiry only
//! decides when another manager may take over; no clock comparison decides
//! what is deleted. *Why no manager retires another's working key:*
//! rotation runs under the drive lease from the keys the database holds; it
//! first installs the recorded current key if the drive may lack it, rotates
//! only if the recorded key is older than `rotate_interval`, and writes the
//! record under the fence.
//!
//! **Failover** (`nasd_fs`'s `Managers`): a client given several managers
//! opens each new connection to the manager in use, else the next that
//! answers; its handles work on every manager and its session logs in
//! again. A request that got no reply is resent only if it only reads: an
//! acknowledged operation is committed in the database, so no manager's
//! death loses it.
//!
//! **Not covered yet:** a request-path revocation racing another manager's
//! on one object can, in a narrow window, leave a drive at the lower of two
//! access-control versions until the maintenance pass sets the logged one
//! (`DriveHandle::set_acv` orders one process's calls only); repair and
//! scrub passes run on every manager (safe — a repair works inside a write
//! intent, one per file — but scrubs are repeated).

use crate::keys::DriveKeys;
use crate::{Failure, Manager};
use anyhow::Context;
use nasd_meta::{DriveState, Lease, Store};
use nasd_proto::fs::{FsStatus, Ino};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// File name of the manager's id inside its directory: random, made once,
/// so a restarted manager is the same holder of the leases it held.
pub const MANAGER_ID_FILE: &str = "manager.id";
/// Length of a manager id in bytes (hex in the file: twice as many characters).
const MANAGER_ID_LEN: usize = 8;
/// How long a drive's lease (pool refill, orphan collection, key rotation)
/// lasts unless released: past it, a manager that died holding it no
/// longer keeps the others from looking after the drive. Far above what one
/// refill or collection takes (each drive call is bounded by
/// `drives::DRIVE_TIMEOUT`); a holder slower than this is fenced off.
pub const DRIVE_LEASE_TTL: Duration = Duration::from_secs(30);
/// How long an inode's lease (one `SETATTR` or truncating `CREATE`, from
/// its permission check through the drives' size change to its commit; one
/// `WRITE_SMALL`) lasts unless released.
pub const INODE_LEASE_TTL: Duration = Duration::from_secs(60);
/// Longest a request waits for an inode's lease another manager holds:
/// past the lease's life, so a dead holder's lease is taken over first.
pub const INODE_LEASE_WAIT_MAX: Duration = Duration::from_secs(75);
/// Pause between tries for an inode's lease another manager holds.
const INODE_LEASE_POLL: Duration = Duration::from_millis(10);
/// How long an object taken from a pool for a repair stays reserved (kept
/// from orphan collection) unless the repair finishes or gives it up first.
pub const RESERVATION_TTL: Duration = Duration::from_secs(3600);
/// Setting that counts changes of users' credentials (groups, gateway
/// grants): every manager's sessions reload their user when it moves.
pub const USERS_EPOCH_SETTING: &str = "users_epoch";

const _: () = assert!(INODE_LEASE_WAIT_MAX.as_millis() > INODE_LEASE_TTL.as_millis());
const _: () = assert!(DRIVE_LEASE_TTL.as_secs() >= 3 * crate::drives::DRIVE_TIMEOUT.as_secs());

/// The id of the manager in `dir` (made on first use).
pub(crate) fn manager_id(dir: &Path) -> anyhow::Result<String> {
    let path = dir.join(MANAGER_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) => {
            let id = s.trim().to_string();
            anyhow::ensure!(
                id.len() == 2 * MANAGER_ID_LEN && id.bytes().all(|b| b.is_ascii_hexdigit()),
                "{} does not hold a manager id ({} hex digits)",
                path.display(),
                2 * MANAGER_ID_LEN
            );
            Ok(id)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id: String = nasd_crypto::random_bytes::<MANAGER_ID_LEN>().iter().map(|b| format!("{b:02x}")).collect();
            let tmp = dir.join(format!("{MANAGER_ID_FILE}.tmp"));
            std::fs::write(&tmp, format!("{id}\n")).with_context(|| format!("cannot write {}", tmp.display()))?;
            std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))?;
            Ok(id)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// A lease held for one piece of work; released when the work is done.
pub(crate) struct Held {
    pub(crate) lease: Lease,
}

/// An inode's serialization: this process's lock of the inode and, on a
/// database other managers may share, its lease, released on drop.
pub(crate) struct InodeGuard<'a> {
    _local: tokio::sync::MutexGuard<'a, ()>,
    lease: Option<(Arc<nasd_meta::Namespace<Store>>, Lease)>,
}

impl Drop for InodeGuard<'_> {
    fn drop(&mut self) {
        if let Some((ns, lease)) = self.lease.take() {
            // Released off the async threads; if it fails, the lease lapses.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn_blocking(move || {
                    if let Err(e) = ns.release_lease(&lease) {
                        tracing::debug!(lease = %lease.name, error = %e, "an inode lease was left to lapse");
                    }
                });
            }
        }
    }
}

impl Manager {
    /// Whether other managers may share this manager's database: leases
    /// are taken for what only one may do at a time. SQLite is one
    /// manager's file, and its in-process locks are enough.
    pub(crate) fn shared_database(&self) -> bool {
        matches!(self.ns.backend(), Store::Postgres(_))
    }

    /// This manager's id (the holder of its leases).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Acquires lease `name` for `ttl` if no other manager holds it.
    /// `Ok(None)`: another one does.
    pub(crate) async fn acquire(&self, name: String, ttl: Duration) -> Result<Option<Held>, Failure> {
        let id = self.id.clone();
        let lease = Self::bookkeeping(self.meta(move |ns| ns.acquire_lease(&name, &id, ttl))).await?;
        Ok(lease.map(|lease| Held { lease }))
    }

    /// Gives a lease up (it lapses if this fails).
    pub(crate) async fn release(&self, held: Held) {
        let lease = held.lease;
        if let Err(e) = self.meta(move |ns| ns.release_lease(&lease).map(|_| ())).await {
            tracing::debug!(error = %e, "a lease was left to lapse");
        }
    }

    /// The lease of drive `drive`'s upkeep (pool refill, orphan collection,
    /// key rotation), or `None` if another manager holds it now.
    pub(crate) async fn drive_lease(&self, drive: u32) -> Result<Option<Held>, Failure> {
        self.acquire(format!("drive/{drive}"), DRIVE_LEASE_TTL).await
    }

    /// [`Manager::drive_lease`], with another manager's hold as `Busy`.
    pub(crate) async fn drive_lease_or_busy(&self, drive: u32) -> Result<Held, Failure> {
        self.drive_lease(drive).await?.ok_or_else(|| self.lease_busy(drive))
    }

    /// The failure of work on `drive` another manager's lease holds off.
    pub(crate) fn lease_busy(&self, drive: u32) -> Failure {
        Failure::new(FsStatus::Busy, format!("another manager is looking after drive {drive} now; try again"))
    }

    /// Waits for the lock of inode `ino`: this process's (one of
    /// `INODE_LOCK_STRIPES`) and, on a shared database, the inode's lease,
    /// so no other manager's `SETATTR` of the inode runs in between either.
    /// `SETATTR` holds it from its permission check through the drive's size
    /// change to its commit, and a truncating `CREATE` likewise, so no chmod
    /// or chown of the inode lands in between; each `WRITE_SMALL` attempt
    /// holds it for its metadata transaction, so small writes of one file
    /// through several managers take turns with each other and with those.
    ///
    /// # Errors
    /// `Busy` if another manager held the lease for [`INODE_LEASE_WAIT_MAX`].
    pub(crate) async fn inode_lock(&self, ino: Ino) -> Result<InodeGuard<'_>, Failure> {
        self.take_turn(&self.inode_locks, ino, format!("inode/{ino}")).await
    }

    /// Waits for the turn to set the PAL of file `ino` (or the super PAL
    /// of collection `ino`) on the drives: this process's lock (one of
    /// `INODE_LOCK_STRIPES`, apart from the inode locks) and, on a shared
    /// database, the lease `pal/INO` (`superpal/INO`). A push holds it from
    /// reading what to set through the drives' answers to clearing its
    /// record, so two pushes of one PAL — a change's and a retry's, on any
    /// managers — never land in the opposite order of their reads: the last
    /// to land is the newest. Never held together with an inode lock.
    ///
    /// # Errors
    /// `Busy` if another manager held the lease for [`INODE_LEASE_WAIT_MAX`].
    pub(crate) async fn pal_turn(&self, what: nasd_meta::PalPush, ino: Ino) -> Result<InodeGuard<'_>, Failure> {
        let name = match what {
            nasd_meta::PalPush::File => format!("pal/{ino}"),
            nasd_meta::PalPush::Collection => format!("superpal/{ino}"),
        };
        self.take_turn(&self.pal_locks, ino, name).await
    }

    /// Waits for stripe `ino % INODE_LOCK_STRIPES` of `stripes` and, on a
    /// shared database, lease `name`.
    async fn take_turn<'a>(
        &'a self,
        stripes: &'a [tokio::sync::Mutex<()>],
        ino: Ino,
        name: String,
    ) -> Result<InodeGuard<'a>, Failure> {
        let local = stripes[(ino % stripes.len() as u64) as usize].lock().await;
        if !self.shared_database() {
            return Ok(InodeGuard { _local: local, lease: None });
        }
        let deadline = Instant::now() + INODE_LEASE_WAIT_MAX;
        loop {
            if let Some(held) = self.acquire(name.clone(), INODE_LEASE_TTL).await? {
                return Ok(InodeGuard { _local: local, lease: Some((self.ns.clone(), held.lease)) });
            }
            if Instant::now() >= deadline {
                return Err(Failure::new(
                    FsStatus::Busy,
                    format!("another manager holds {name} (is changing it); try again"),
                ));
            }
            tokio::time::sleep(INODE_LEASE_POLL).await;
        }
    }

    /// Reads again what this manager caches from the database and another
    /// manager may have changed: the drive table (new drives, rotated keys,
    /// drives taken out of service), the map epoch, and the users' epoch.
    /// A rotated key is taken with its install pending: capabilities are
    /// minted with the previous key (which the drive has either way) until
    /// this manager has seen the drive confirm the new one.
    pub async fn refresh_shared(&self) -> Result<(), Failure> {
        let records = self.meta(|ns| ns.drives()).await?;
        let mut out = std::collections::HashSet::new();
        for rec in &records {
            if rec.state == DriveState::Out {
                out.insert(rec.drive);
            }
            let keys = DriveKeys::open(&self.kek, rec.drive, &rec.sealed_keys).ok_or_else(|| {
                Failure::new(
                    FsStatus::Internal,
                    format!("the keys of drive {} do not open with this manager's key", rec.drive),
                )
            })?;
            match self.drives().into_iter().find(|d| d.drive == rec.drive) {
                None => {
                    tracing::info!(drive = rec.drive, addr = %rec.addr, "a drive another manager added");
                    self.attach(rec, keys);
                }
                Some(d) => {
                    let have = d.keys();
                    if have.current.0 != keys.current.0 || have.previous.0 != keys.previous.0 {
                        tracing::info!(
                            drive = rec.drive,
                            version = keys.current.0,
                            "working key another manager rotated"
                        );
                        d.set_keys(keys);
                    }
                }
            }
        }
        *self.out_of_service.lock().expect("out lock") = out;
        let (epoch, users) = self.meta(|ns| Ok((ns.map_epoch()?, ns.counter(USERS_EPOCH_SETTING)?))).await?;
        self.map_epoch.fetch_max(epoch, Ordering::SeqCst);
        if self.shared_users_epoch.swap(users, Ordering::SeqCst) != users {
            self.users_changed_here();
        }
        Ok(())
    }

    /// Records that users' credentials changed: every session of every
    /// manager reloads its user before its next request (this manager's at
    /// once, the others' after their next maintenance pass reads the
    /// database's users epoch).
    pub(crate) async fn users_changed(&self) {
        self.users_changed_here();
        match self.meta(|ns| ns.bump_counter(USERS_EPOCH_SETTING)).await {
            Ok(n) => {
                self.shared_users_epoch.store(n, Ordering::SeqCst);
            }
            Err(e) => tracing::warn!(error = %e, "other managers learn of the users' change later"),
        }
    }
}
