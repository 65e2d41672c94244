//! The trace id of the operation a task works for (docs/PROTOCOL.md,
//! "Trace ids"), held in a tokio task-local so that every request the
//! operation makes carries it without being passed it: [`DriveClient`]
//! puts it in each frame on a version-2 connection, and the file-system
//! client puts it in a `TRACED` envelope around each manager request.
//!
//! A front end opens one [`operation`] per user-level operation (a
//! command, a kernel request, an HTTP request); a task it spawns for the
//! operation takes the id along with [`scope`] ([`current`] before the
//! spawn). Outside any scope, requests carry no trace id.
//!
//! [`DriveClient`]: crate::DriveClient

use nasd_env::Env;
use nasd_proto::TraceId;
use std::future::Future;
use tracing::Instrument;

tokio::task_local! {
    static TRACE: Option<TraceId>;
}

/// The trace id of the operation this task works for, if any.
pub fn current() -> Option<TraceId> {
    TRACE.try_with(Clone::clone).ok().flatten()
}

/// Runs `fut` with `trace` as its trace id ([`current`] inside it).
pub fn scope<F: Future>(trace: Option<TraceId>, fut: F) -> impl Future<Output = F::Output> {
    TRACE.scope(trace, fut)
}

/// A fresh trace id: 128 bits of `env`'s randomness.
pub fn fresh(env: &Env) -> TraceId {
    TraceId::from_random(env.random_u64(), env.random_u64())
}

/// Runs `fut` as the user-level operation `op`: under the caller's trace id
/// if it runs in one already, else a fresh one, and inside an `operation`
/// span (`op`, `trace_id`), so what the client logs meanwhile carries the id
/// the manager and the drives log for the same operation.
///
/// `fut` moves to the heap at once: what is returned is small, however
/// large the operation's future (a gateway's request may be hundreds of
/// kilobytes in a debug build, and moving it about could overflow a stack).
pub fn operation<F: Future>(env: &Env, op: &'static str, fut: F) -> impl Future<Output = F::Output> {
    let fut = Box::pin(fut);
    let trace = current().unwrap_or_else(|| fresh(env));
    let span = tracing::info_span!("operation", op, trace_id = %trace);
    let started = std::time::Instant::now();
    let done = async move {
        let out = fut.await;
        tracing::debug!(elapsed_us = started.elapsed().as_micros() as u64, "operation done");
        out
    };
    scope(Some(trace), done.instrument(span))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_operation_keeps_the_id_it_runs_under_and_makes_one_otherwise() {
        assert_eq!(current(), None);
        let env = Env::real();
        let outer = operation(&env, "outer", async {
            let id = current().expect("an operation has a trace id");
            let inner = operation(&env, "inner", async { current() }).await;
            assert_eq!(inner.as_ref(), Some(&id), "a nested operation keeps its caller's id");
            id
        })
        .await;
        let other = operation(&env, "other", async { current() }).await.unwrap();
        assert_ne!(outer, other, "each operation gets its own id");
        assert_eq!(outer.as_str().len(), 32);
        assert_eq!(current(), None, "no id outside the operation");
    }
}
