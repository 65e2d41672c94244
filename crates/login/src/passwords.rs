//! Passwords at rest: argon2id hashes in PHC string form (salt and
//! parameters inside), verified in constant time.
//!
//! Argon2 is memory-hard by design: each hash or check fills ~19 MiB of
//! blocks. The manager computes them only on a fixed [`Pool`] of
//! [`ARGON2_WORKERS`] dedicated threads, each filling the one [`Memory`] it
//! allocated for its first job, so their memory is
//! `ARGON2_WORKERS × ARGON2_MEMORY_BYTES` however many logins arrive — not a
//! fresh 19 MiB per check on whichever thread runs it, which the allocator
//! kept (2.5 GB after 16 clients guessed passwords for a while).

use argon2::password_hash::{rand_core::OsRng, Output, PasswordHash, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

/// Shortest password an administrator may set.
pub const PASSWORD_MIN: usize = 8;
/// Argon2 computations run at once: one per worker thread.
pub const ARGON2_WORKERS: usize = 4;
/// Argon2 jobs waiting for a worker; more callers wait to queue theirs (a
/// waiting job holds one password: at most `PASSWORD_MAX` bytes).
pub const ARGON2_QUEUE_MAX: usize = 64;
/// Memory one worker fills per hash: argon2id's default cost (m = 19 MiB),
/// which every hash this manager makes uses. A stored hash that asks for
/// more never matches (and is logged) instead of growing the buffer.
pub const ARGON2_MEMORY_BYTES: usize = Params::DEFAULT_M_COST as usize * 1024;

/// The blocks one argon2 computation fills, allocated once per worker.
pub struct Memory {
    blocks: Vec<Block>,
}

impl Memory {
    /// [`ARGON2_MEMORY_BYTES`] of blocks.
    pub fn new() -> Memory {
        Memory { blocks: vec![Block::default(); Params::default().block_count()] }
    }
}

impl Default for Memory {
    fn default() -> Self {
        Memory::new()
    }
}

/// The argon2id PHC hash of `password` with a fresh random salt and the
/// default parameters, computed in `memory`.
pub fn hash_with(memory: &mut Memory, password: &str) -> String {
    let salt = SaltString::generate(&mut OsRng);
    let params = Params::default();
    let argon2 = Argon2::new(Algorithm::Argon2id, Version::V0x13, params.clone());
    let mut salt_buf = [0u8; 64];
    let salt_bytes = salt.as_salt().decode_b64(&mut salt_buf).expect("a generated salt decodes");
    let output = Output::init_with(Params::DEFAULT_OUTPUT_LEN, |out| {
        argon2
            .hash_password_into_with_memory(password.as_bytes(), salt_bytes, out, &mut memory.blocks)
            .map_err(|_| argon2::password_hash::Error::Crypto)
    })
    .expect("argon2 with default parameters");
    let phc = PasswordHash {
        algorithm: Algorithm::Argon2id.ident(),
        version: Some(Version::V0x13.into()),
        params: (&params).try_into().expect("default parameters encode"),
        salt: Some(salt.as_salt()),
        hash: Some(output),
    };
    phc.to_string()
}

/// The argon2id PHC hash of `password` with a fresh random salt, in memory
/// of its own (one-off uses outside the manager: `nasd admin
/// reset-password`).
pub fn hash(password: &str) -> String {
    hash_with(&mut Memory::new(), password)
}

/// True if `password` matches `phc`, computed in `memory`. A malformed
/// stored hash, or one whose parameters need more than `memory`, never
/// matches.
pub fn verify_with(memory: &mut Memory, password: &str, phc: &str) -> bool {
    let Ok(hash) = PasswordHash::new(phc) else { return false };
    let (Some(salt), Some(expected)) = (hash.salt, hash.hash) else { return false };
    let Ok(algorithm) = Algorithm::try_from(hash.algorithm) else { return false };
    let version = hash.version.map_or(Ok(Version::V0x13), Version::try_from);
    let (Ok(version), Ok(params)) = (version, Params::try_from(&hash)) else { return false };
    if params.block_count() > memory.blocks.len() {
        tracing::warn!(m_cost = params.m_cost(), "a stored password hash needs more argon2 memory than a worker has");
        return false;
    }
    let mut salt_buf = [0u8; 64];
    let Ok(salt) = salt.decode_b64(&mut salt_buf) else { return false };
    let mut out = vec![0u8; expected.len()];
    let argon2 = Argon2::new(algorithm, version, params);
    argon2.hash_password_into_with_memory(password.as_bytes(), salt, &mut out, &mut memory.blocks).is_ok()
        && nasd_crypto::ct_eq(&out, expected.as_bytes())
}

/// True if `password` matches `phc`, in memory of its own.
pub fn verify(password: &str, phc: &str) -> bool {
    verify_with(&mut Memory::new(), password, phc)
}

/// A hash no password matches in practice, verified for unknown user names
/// so that a login takes as long whether or not the name exists.
pub fn decoy() -> String {
    hash(&nasd_crypto::Key::random().to_hex())
}

type Job = Box<dyn FnOnce(&mut Memory) + Send>;

/// [`ARGON2_WORKERS`] threads computing argon2 jobs, each in its own
/// [`Memory`]; jobs queue (at most [`ARGON2_QUEUE_MAX`]) for a free one.
/// The threads end when the pool is dropped.
pub struct Pool {
    jobs: Workers,
}

/// Where a [`Pool`]'s jobs run.
enum Workers {
    /// Its own threads, fed by this queue.
    Threads(mpsc::Sender<Job>),
    /// A simulated environment's blocking tasks, one [`Memory`] each: the
    /// simulator runs blocking work in turn with its one thread, so a hash
    /// never overlaps simulated time.
    Env(nasd_env::Env),
}

impl Pool {
    /// Starts the worker threads (their memory is allocated at their first job).
    pub fn start() -> Pool {
        Pool::start_in(&nasd_env::Env::real())
    }

    /// [`Pool::start`] in `env`: the real environment starts the threads, a
    /// simulated one runs each job as one of its blocking tasks.
    pub fn start_in(env: &nasd_env::Env) -> Pool {
        if !env.is_real() {
            return Pool { jobs: Workers::Env(env.clone()) };
        }
        let (jobs, queue) = mpsc::channel::<Job>(ARGON2_QUEUE_MAX);
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..ARGON2_WORKERS {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("argon2-{i}"))
                .spawn(move || work(&queue))
                .expect("cannot start an argon2 worker thread");
        }
        Pool { jobs: Workers::Threads(jobs) }
    }

    /// Runs `f` on a worker with its memory, once one is free. A caller that
    /// gives up (a login timing out) does not stop a job already running;
    /// a job still queued whose caller is gone is skipped.
    ///
    /// # Errors
    /// The workers are gone (the pool is being dropped).
    pub async fn run<R: Send + 'static>(&self, f: impl FnOnce(&mut Memory) -> R + Send + 'static) -> Result<R, String> {
        let jobs = match &self.jobs {
            Workers::Threads(jobs) => jobs,
            Workers::Env(env) => {
                return env.spawn_blocking(move || f(&mut Memory::new())).await.map_err(|e| {
                    if e.is_panic() {
                        eprintln!("fatal: an argon2 job panicked; stopping the manager");
                        std::process::abort();
                    }
                    "an argon2 job did not finish".to_string()
                });
            }
        };
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |memory| {
            if !tx.is_closed() {
                let _ = tx.send(f(memory));
            }
        });
        jobs.send(job).await.map_err(|_| "the argon2 workers have stopped".to_string())?;
        rx.await.map_err(|_| "an argon2 job did not finish".to_string())
    }
}

/// One worker: takes jobs until the pool is dropped. A panic in a job is a
/// broken invariant: the manager stops (fail-stop, as for metadata tasks).
fn work(queue: &Mutex<mpsc::Receiver<Job>>) {
    let mut memory: Option<Memory> = None;
    loop {
        let job = queue.lock().expect("argon2 queue mutex poisoned").blocking_recv();
        let Some(job) = job else { return };
        let memory = memory.get_or_insert_with(Memory::new);
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(memory))).is_err() {
            tracing::error!("an argon2 job panicked: stopping the manager");
            eprintln!("fatal: an argon2 job panicked; stopping the manager");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argon2id_hashes_verify_only_their_password() {
        let mut memory = Memory::new();
        let h = hash_with(&mut memory, "correct horse");
        assert!(h.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{h}");
        assert!(verify_with(&mut memory, "correct horse", &h));
        assert!(!verify_with(&mut memory, "correct horsf", &h));
        assert!(!verify_with(&mut memory, "correct horse", "not a hash"));
        assert_ne!(hash_with(&mut memory, "correct horse"), h, "salted");
    }

    /// Hashes made by the argon2 crate's own `PasswordHasher` (as the
    /// manager stored them before the worker pool) verify, and ours verify
    /// with its `PasswordVerifier`: the PHC strings are the same.
    #[test]
    fn hashes_are_interchangeable_with_the_argon2_crates() {
        use argon2::{PasswordHasher, PasswordVerifier};
        let mut memory = Memory::new();
        let salt = SaltString::generate(&mut OsRng);
        let theirs = Argon2::default().hash_password(b"battery staple", &salt).unwrap().to_string();
        assert!(verify_with(&mut memory, "battery staple", &theirs));
        assert!(!verify_with(&mut memory, "battery stapler", &theirs));
        let ours = hash_with(&mut memory, "battery staple");
        assert!(Argon2::default().verify_password(b"battery staple", &PasswordHash::new(&ours).unwrap()).is_ok());
    }

    /// A stored hash asking for more memory than a worker has never matches
    /// (rather than growing the buffer).
    #[test]
    fn hashes_needing_more_memory_than_a_worker_has_never_match() {
        use argon2::PasswordHasher;
        let params = Params::new(2 * Params::DEFAULT_M_COST, 1, 1, None).unwrap();
        let salt = SaltString::generate(&mut OsRng);
        let big = Argon2::new(Algorithm::Argon2id, Version::V0x13, params).hash_password(b"pw", &salt).unwrap();
        assert!(!verify_with(&mut Memory::new(), "pw", &big.to_string()));
    }
}
