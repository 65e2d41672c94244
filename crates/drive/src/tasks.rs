//! The drive's tasks and fail-stop: store work runs on blocking threads, and
//! a panic in any drive task — a store task or a connection — is a broken
//! invariant that stops the process (ARCHITECTURE.md, "Fail-stop vs
//! isolation"). Answering `IO_ERROR` and going on would serve from state the
//! panic may have left half-changed (a poisoned store lock, an index
//! updated without its blocks); a restart recovers from the durable state.
//! This holds in every build, not only with `panic = "abort"`.

use tokio::task::{JoinError, JoinHandle};

/// Runs `f` (store or other disk work) on a blocking thread and waits for
/// it; if it panics, the drive stops.
pub(crate) async fn blocking<R: Send + 'static>(env: &nasd_env::Env, f: impl FnOnce() -> R + Send + 'static) -> R {
    join(env.spawn_blocking(f)).await
}

/// Waits for a task the drive spawned; if it panicked, the drive stops.
pub(crate) async fn join<R>(task: JoinHandle<R>) -> R {
    match task.await {
        Ok(r) => r,
        Err(e) => stopped_or_fail_stop(e).await,
    }
}

/// A task that did not return: a panic stops the drive. A task cancelled
/// (the runtime is shutting down, which drops the waiter too) never
/// returns to its waiter.
async fn stopped_or_fail_stop<R>(e: JoinError) -> R {
    if e.is_panic() {
        fail_stop(&e)
    }
    std::future::pending().await
}

/// Logs why and aborts the process.
pub(crate) fn fail_stop(e: &JoinError) -> ! {
    tracing::error!(error = %e, "a drive task panicked: stopping the drive (fail-stop)");
    eprintln!("fatal: a drive task panicked ({e}); stopping the drive (a restart recovers from the durable state)");
    std::process::abort()
}

/// Test-only fault points, compiled in only with the cargo feature
/// `fault-injection` (never in a default or release build) and armed only by
/// the environment the drive process starts with — nothing a peer sends can
/// reach them.
#[cfg(feature = "fault-injection")]
pub(crate) mod fault {
    /// The environment variable naming an opcode (`0x0103`) whose store
    /// task panics.
    pub const PANIC_IN_OPCODE: &str = "NASD_FAULT_PANIC_IN_OPCODE";

    /// The environment variable naming a file: while it exists, every write
    /// of the drive's key settings waits (a disk that stalls), after creating
    /// the file's name with `.reached` appended to say so.
    pub const STALL_SETTINGS_WHILE: &str = "NASD_FAULT_STALL_SETTINGS_WHILE";
    /// How often a stalled settings write looks for its file.
    const STALL_POLL: std::time::Duration = std::time::Duration::from_millis(10);

    /// Waits while the file named by [`STALL_SETTINGS_WHILE`] exists.
    pub fn settings_write() {
        let Some(file) = std::env::var_os(STALL_SETTINGS_WHILE) else { return };
        let file = std::path::PathBuf::from(file);
        if file.exists() {
            let mut reached = file.clone().into_os_string();
            reached.push(".reached");
            std::fs::write(reached, b"").expect("fault point: cannot say the stall was reached");
        }
        while file.exists() {
            std::thread::sleep(STALL_POLL);
        }
    }

    /// Panics if the process was started to panic in the store task of `opcode`.
    pub fn store_task(opcode: u16) {
        if std::env::var(PANIC_IN_OPCODE).is_ok_and(|v| v == format!("{opcode:#06x}")) {
            panic!("injected fault: the store task of opcode {opcode:#06x} panics");
        }
    }
}
