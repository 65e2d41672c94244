//! Connections to drives, shared by every striped object of a client.
//!
//! Per drive address the pool keeps at most [`DRIVE_INFLIGHT_MAX`]
//! connections busy at once (so requests to one drive pipeline: while one
//! connection waits for a reply, the next request is already on another)
//! and at most [`DRIVE_IDLE_MAX`] idle ones for reuse. A connection that
//! failed other than by a drive's refusal is never returned (the client
//! marks it broken; a new one is made on next use). An idle connection the
//! drive closed meanwhile — a drive ends connections idle for its idle
//! timeout, and a stopped or restarted drive all of its connections — is
//! found without waiting (`DriveClient::is_reusable`) and dropped before
//! reuse, so no request goes out on it.

use crate::error::FailureCause;
use crate::target::Binding;
use nasd_client::{Auth, ClientError, DriveClient};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Requests one drive has in flight from this pool at once (each on its own
/// connection). More lets one drive serve a striped read and a prefetch
/// with no idle round trip between them; each costs a connection and, on
/// the drive, a connection's transfer buffers.
pub const DRIVE_INFLIGHT_MAX: usize = 4;
/// Idle connections kept per drive for reuse (each an open socket and a
/// read chunk buffer of up to 4 MiB, `CHUNK_LEN_MAX`).
pub const DRIVE_IDLE_MAX: usize = 4;
/// Drive addresses the pool tracks at once (one entry each: a semaphore and
/// the idle list). Past it, entries with nothing busy are dropped, with
/// their idle connections.
pub const POOL_DRIVES_MAX: usize = nasd_proto::manager::DRIVES_MAX;

const _: () = assert!(DRIVE_IDLE_MAX <= DRIVE_INFLIGHT_MAX);

struct Slot {
    permits: Arc<Semaphore>,
    /// Idle connections, each with the generation of the identity it holds.
    idle: Mutex<Vec<(DriveClient, u64)>>,
}

/// The identity a pool's connections hold, and its generation (one more at
/// every [`DrivePool::set_identity`]).
struct Held {
    identity: Option<Auth>,
    generation: u64,
}

/// Connections per drive address, reused across striped objects.
pub struct DrivePool {
    /// Where connections are made and tasks run ([`DrivePool::new_in`]).
    env: nasd_env::Env,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// The identity every connection of the pool holds beside its
    /// bindings' capabilities (`DriveClient::set_identity`): requests go
    /// under it where the partition accepts PALs. Replaced by
    /// [`DrivePool::set_identity`] (a renewed identity key).
    identity: Mutex<Held>,
}

impl std::fmt::Debug for DrivePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrivePool").field("drives", &lock(&self.slots).len()).finish()
    }
}

impl Default for DrivePool {
    fn default() -> Self {
        DrivePool::new()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A connection (or the right to make one) to one drive, holding one of
/// its in-flight permits until dropped. Dropped without
/// [`release`](Lease::release), its connection is closed.
pub(crate) struct Lease {
    env: nasd_env::Env,
    slot: Arc<Slot>,
    client: Option<DriveClient>,
    /// The generation of the identity `client` holds.
    client_generation: u64,
    /// The pool's identity when the lease was taken, and its generation.
    identity: Option<Auth>,
    generation: u64,
    /// Whether the connection came from the idle list (it may have gone
    /// stale while idle: a failure on it is worth one try on a new one).
    pub(crate) reused: bool,
    _permit: OwnedSemaphorePermit,
}

impl Lease {
    /// The connection, connecting first if there is none (within
    /// `deadlines.connect` in all, each step within the smaller of it and
    /// `deadlines.wait`); checks the drive's identity against the binding's.
    /// The connection then bounds each wait for the drive by `deadlines.wait`
    /// (`DriveClient::set_timeout`; set on every use, since connections are
    /// shared by engines with other options).
    pub(crate) async fn client(
        &mut self,
        binding: &Binding,
        deadlines: Deadlines,
    ) -> Result<&mut DriveClient, FailureCause> {
        if self.client.is_none() {
            let step = deadlines.connect.min(deadlines.wait);
            let connect = DriveClient::connect_in(&self.env, binding.addr.as_str(), step);
            let c = match tokio::time::timeout(deadlines.connect, connect).await {
                Err(_) => return Err(FailureCause::Deadline),
                Ok(Err(e)) => return Err(FailureCause::Drive(Arc::new(e))),
                Ok(Ok(c)) => c,
            };
            if c.drive_id() != binding.drive_id {
                return Err(FailureCause::WrongDrive { addr: binding.addr.clone() });
            }
            self.client = Some(c);
            self.client_generation = self.generation.wrapping_sub(1);
        }
        let c = self.client.as_mut().expect("connected above");
        if self.client_generation != self.generation {
            // A new connection, or one made before the identity was renewed: it takes the
            // pool's identity now (requests in flight on other connections keep theirs).
            c.set_identity(self.identity.clone());
            self.client_generation = self.generation;
        }
        c.set_timeout(deadlines.wait);
        c.set_auth(binding.auth.clone());
        Ok(c)
    }

    /// Returns the connection to the idle list (if there is room).
    pub(crate) fn release(mut self) {
        if let Some(c) = self.client.take() {
            let mut idle = lock(&self.slot.idle);
            if idle.len() < DRIVE_IDLE_MAX {
                idle.push((c, self.client_generation));
            }
        }
    }

    /// Drops the connection (it failed in a way that leaves it unusable).
    pub(crate) fn discard(mut self) {
        self.client = None;
    }
}

/// How long connecting to a drive may take in all, and each wait for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    pub(crate) connect: Duration,
    pub(crate) wait: Duration,
}

/// Whether a failed call leaves its connection unusable: every failure but
/// a drive's refusal and a request refused before it was sent.
pub(crate) fn unusable_connection(e: &ClientError) -> bool {
    !matches!(e, ClientError::Status { .. } | ClientError::InvalidRequest(_))
}

/// Drops the idle connections that cannot carry another request: the
/// drive closed them (after its idle timeout, or as it stopped) or sent
/// bytes no request asked for. Found without waiting.
fn drop_closed(idle: &mut Vec<(DriveClient, u64)>) {
    idle.retain(|(c, _)| c.is_reusable());
}

impl DrivePool {
    /// An empty pool.
    pub fn new() -> DrivePool {
        DrivePool::with_identity(None)
    }

    /// An empty pool whose connections hold `identity` (an identity
    /// credential from the authentication server) beside each binding's
    /// capability: a request goes under the identity where the partition's
    /// scheme accepts PALs, and under the capability elsewhere
    /// (`DriveClient::set_identity`), without the caller noticing.
    pub fn with_identity(identity: Option<Auth>) -> DrivePool {
        DrivePool::with_identity_in(&nasd_env::Env::real(), identity)
    }

    /// An empty pool in `env`: its connections, the striping engine's tasks
    /// and its coding work are the environment's.
    pub fn new_in(env: &nasd_env::Env) -> DrivePool {
        DrivePool::with_identity_in(env, None)
    }

    /// [`DrivePool::with_identity`] in `env`.
    pub fn with_identity_in(env: &nasd_env::Env, identity: Option<Auth>) -> DrivePool {
        DrivePool {
            env: env.clone(),
            slots: Mutex::new(HashMap::new()),
            identity: Mutex::new(Held { identity, generation: 0 }),
        }
    }

    /// The environment the pool runs in.
    pub fn env(&self) -> &nasd_env::Env {
        &self.env
    }

    /// Replaces the identity the pool's connections hold (a renewed
    /// identity key): every request leased from now on goes under the new
    /// one — on an idle connection too, which takes it at its next lease —
    /// while requests in flight finish under the one they started with.
    pub fn set_identity(&self, identity: Option<Auth>) {
        let mut held = lock(&self.identity);
        held.identity = identity;
        held.generation = held.generation.wrapping_add(1);
    }

    /// The identity the pool's connections hold now.
    pub fn identity(&self) -> Option<Auth> {
        lock(&self.identity).identity.clone()
    }

    fn slot(&self, addr: &str) -> Arc<Slot> {
        let mut slots = lock(&self.slots);
        if let Some(s) = slots.get(addr) {
            return s.clone();
        }
        if slots.len() >= POOL_DRIVES_MAX {
            // Only this map holds an entry that nothing is using.
            slots.retain(|_, s| Arc::strong_count(s) > 1);
        }
        let s = Arc::new(Slot { permits: Arc::new(Semaphore::new(DRIVE_INFLIGHT_MAX)), idle: Mutex::new(Vec::new()) });
        slots.insert(addr.to_string(), s.clone());
        s
    }

    /// Waits for one of the drive's in-flight permits and takes an idle
    /// connection to the binding's drive if there is one.
    ///
    /// # Cancel safety
    /// Cancelling drops the permit and the connection, nothing else.
    pub(crate) async fn lease(&self, binding: &Binding) -> Lease {
        let slot = self.slot(&binding.addr);
        let permit = slot.permits.clone().acquire_owned().await.expect("the pool never closes its semaphores");
        let client = {
            let mut idle = lock(&slot.idle);
            // A connection to another drive at this address (the drive was
            // replaced) is dropped.
            idle.retain(|(c, _)| c.drive_id() == binding.drive_id);
            drop_closed(&mut idle);
            idle.pop()
        };
        let (identity, generation) = {
            let held = lock(&self.identity);
            (held.identity.clone(), held.generation)
        };
        let (client, client_generation) = client.map_or((None, generation), |(c, g)| (Some(c), g));
        Lease {
            env: self.env.clone(),
            reused: client.is_some(),
            slot,
            client,
            client_generation,
            identity,
            generation,
            _permit: permit,
        }
    }

    /// Idle connections to `addr` that are still open (those the drive
    /// closed are dropped first), for tests and diagnostics.
    pub fn idle_connections(&self, addr: &str) -> usize {
        lock(&self.slots).get(addr).map_or(0, |s| {
            let mut idle = lock(&s.idle);
            drop_closed(&mut idle);
            idle.len()
        })
    }

    /// Drops every idle connection (e.g. after a drive was replaced).
    pub fn clear_idle(&self) {
        for s in lock(&self.slots).values() {
            lock(&s.idle).clear();
        }
    }
}
