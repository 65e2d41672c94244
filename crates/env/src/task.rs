//! Tasks: spawned futures, blocking work, and a blocking task's waits for
//! async events.
//!
//! In the real environment these are tokio's `spawn`, `spawn_blocking` and
//! `blocking_recv`/`blocking_send`. A simulated world tracks every task of a
//! node (a crash of the node ends them all) and runs blocking work in turn
//! with its one thread, so that a blocking task waiting on a channel lets the
//! rest of the world run — deterministically.

use crate::Env;
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

impl Env {
    /// Spawns `fut` as a task of this component (`tokio::spawn`).
    pub fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task = tokio::spawn(fut);
        if let Some(w) = &self.world {
            w.track(task.abort_handle());
        }
        task
    }

    /// Runs `f` — disk work, or anything else that blocks — as a blocking
    /// task (`tokio::task::spawn_blocking`); its handle reports a panic of
    /// `f` as tokio's does (`JoinError::is_panic`).
    pub fn spawn_blocking<F, R>(&self, f: F) -> JoinHandle<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        match &self.world {
            None => tokio::task::spawn_blocking(f),
            Some(w) => {
                let slot = Arc::new(Mutex::new(None));
                let out = slot.clone();
                let done = w.run_blocking(Box::new(move || {
                    let r = f();
                    *out.lock().expect("result slot") = Some(r);
                }));
                self.spawn(async move {
                    done.await;
                    slot.lock().expect("result slot").take().expect("a blocking task that returned left its result")
                })
            }
        }
    }

    /// Waits, from a blocking task ([`Env::spawn_blocking`]), for `fut`.
    ///
    /// # Panics
    /// In the real environment, if called from an async task (as tokio's
    /// `blocking_recv`).
    pub fn block_on<F: Future>(&self, fut: F) -> F::Output {
        match &self.world {
            None => futures_block_on(fut),
            Some(w) => {
                let mut out = None;
                {
                    let mut fut = std::pin::pin!(async {
                        out = Some(fut.await);
                    });
                    w.block_on(fut.as_mut());
                }
                out.expect("block_on returns once its future completed")
            }
        }
    }

    /// Receives from `rx` in a blocking task (`blocking_recv`).
    pub fn recv_blocking<T>(&self, rx: &mut mpsc::Receiver<T>) -> Option<T> {
        match &self.world {
            None => rx.blocking_recv(),
            Some(_) => self.block_on(rx.recv()),
        }
    }

    /// Sends on `tx` from a blocking task (`blocking_send`).
    ///
    /// # Errors
    /// The value back if the receiver is gone.
    pub fn send_blocking<T>(&self, tx: &mpsc::Sender<T>, value: T) -> Result<(), mpsc::error::SendError<T>> {
        match &self.world {
            None => tx.blocking_send(value),
            Some(_) => self.block_on(tx.send(value)),
        }
    }
}

/// Runs `fut` on this (blocking) thread, parking it between wake-ups.
fn futures_block_on<F: Future>(fut: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_blocking_task_waits_on_a_channel_fed_by_an_async_task() {
        let env = Env::real();
        let (tx, mut rx) = mpsc::channel::<u32>(1);
        let (back_tx, mut back_rx) = mpsc::channel::<u32>(1);
        let e = env.clone();
        let worker = env.spawn_blocking(move || {
            let mut sum = 0;
            while let Some(v) = e.recv_blocking(&mut rx) {
                sum += v;
            }
            e.send_blocking(&back_tx, sum).unwrap();
            e.block_on(async { 7 }) + sum
        });
        for v in 1..=10 {
            tx.send(v).await.unwrap();
        }
        drop(tx);
        assert_eq!(back_rx.recv().await, Some(55));
        assert_eq!(worker.await.unwrap(), 62);
    }

    #[tokio::test]
    async fn a_panicking_blocking_task_reports_the_panic() {
        let env = Env::real();
        let e = env.spawn_blocking(|| -> u32 { panic!("boom") }).await.unwrap_err();
        assert!(e.is_panic());
        let spawned = env.spawn(async { 3 }).await.unwrap();
        assert_eq!(spawned, 3);
    }
}
