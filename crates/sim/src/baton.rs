//! Blocking tasks that take turns with the simulator's thread.
//!
//! `Env::spawn_blocking` in a simulated world runs its closure on a thread of
//! its own, but never at the same time as anything else: the runtime's thread
//! hands the turn to the blocking thread when the task's proxy future is
//! polled, and waits until the blocking thread hands it back — when the
//! closure returns, or when it waits for the async world (`Env::block_on`:
//! a channel fed or drained by a connection task). So the world runs one
//! thing at a time, in an order decided by the schedule alone, and a seed
//! replays exactly. A blocking task hands over only where it waits on the
//! async world, where the store holds no lock (its invariant), so no thread
//! ever waits for a lock another one holds.
//!
//! A crash kills a node's blocking tasks: each is unwound at its next
//! hand-over (a panic payload of [`Killed`], never reported as a panic).

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

/// The payload a killed blocking task unwinds with.
pub struct Killed;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    Runtime,
    Thread,
}

#[derive(Default)]
struct State {
    turn: Option<Turn>,
    started: bool,
    done: bool,
    /// Something the blocking task waits for happened since it last looked.
    woken: bool,
    kill: bool,
    panic: Option<Box<dyn Any + Send>>,
    /// The proxy task's waker, woken when the blocking task may go on.
    proxy: Option<Waker>,
}

/// One blocking task's hand-over point.
pub struct Baton {
    state: Mutex<State>,
    cv: Condvar,
}

thread_local! {
    static CURRENT: std::cell::RefCell<Option<Arc<Baton>>> = const { std::cell::RefCell::new(None) };
}

impl Baton {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("baton mutex poisoned")
    }

    /// Gives the turn to the blocking thread and waits until it comes back.
    fn run_thread<'a>(&'a self, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        st.turn = Some(Turn::Thread);
        self.cv.notify_all();
        while st.turn == Some(Turn::Thread) {
            st = self.cv.wait(st).expect("baton mutex poisoned");
        }
        st
    }

    /// On the blocking thread: gives the turn back and waits for the next one.
    /// Unwinds with [`Killed`] if the node crashed meanwhile.
    fn park(&self) {
        let mut st = self.lock();
        st.turn = Some(Turn::Runtime);
        self.cv.notify_all();
        while st.turn != Some(Turn::Thread) {
            st = self.cv.wait(st).expect("baton mutex poisoned");
        }
        if st.kill {
            drop(st);
            std::panic::resume_unwind(Box::new(Killed));
        }
    }

    /// Kills the task: a task not started never runs; one waiting is unwound
    /// now, on its thread, while this (the runtime's) thread waits.
    pub fn kill(&self) {
        let mut st = self.lock();
        if st.done {
            return;
        }
        st.kill = true;
        if !st.started {
            st.done = true;
            return;
        }
        let st = self.run_thread(st);
        debug_assert!(st.done, "a killed blocking task unwinds to its end");
    }

    /// True once the task returned or was killed.
    pub fn is_done(&self) -> bool {
        self.lock().done
    }
}

struct BatonWaker(Arc<Baton>);

impl Wake for BatonWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let proxy = {
            let mut st = self.0.lock();
            st.woken = true;
            st.proxy.clone()
        };
        if let Some(w) = proxy {
            w.wake();
        }
    }
}

/// Starts `f` as a blocking task; the future completes when it returned.
pub fn spawn(f: Box<dyn FnOnce() + Send>, handle: tokio::runtime::Handle) -> (Arc<Baton>, Proxy) {
    let baton = Arc::new(Baton { state: Mutex::new(State::default()), cv: Condvar::new() });
    (baton.clone(), Proxy { baton, start: Some((f, handle)) })
}

/// The runtime's side of a blocking task.
pub struct Proxy {
    baton: Arc<Baton>,
    start: Option<(Box<dyn FnOnce() + Send>, tokio::runtime::Handle)>,
}

impl Future for Proxy {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let baton = self.baton.clone();
        let mut st = baton.lock();
        st.proxy = Some(cx.waker().clone());
        if !st.started && !st.done {
            st.started = true;
            let (f, handle) = self.start.take().expect("started once");
            let b = baton.clone();
            std::thread::Builder::new()
                .name("nasd-sim-blocking".into())
                .spawn(move || thread_main(b, f, handle))
                .expect("spawning a simulated blocking thread");
            st = baton.run_thread(st);
        } else if st.woken && !st.done {
            st.woken = false;
            st = baton.run_thread(st);
        }
        if st.done {
            if let Some(p) = st.panic.take() {
                drop(st);
                std::panic::resume_unwind(p);
            }
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for Proxy {
    /// A proxy dropped before its task ended (its node crashed, or the world
    /// ended) kills the task: nothing of it runs after.
    fn drop(&mut self) {
        self.baton.kill();
    }
}

fn thread_main(baton: Arc<Baton>, f: Box<dyn FnOnce() + Send>, handle: tokio::runtime::Handle) {
    {
        let mut st = baton.lock();
        while st.turn != Some(Turn::Thread) {
            st = baton.cv.wait(st).expect("baton mutex poisoned");
        }
    }
    CURRENT.with(|c| *c.borrow_mut() = Some(baton.clone()));
    let _enter = handle.enter();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CURRENT.with(|c| *c.borrow_mut() = None);
    let mut st = baton.lock();
    st.done = true;
    if let Err(p) = result {
        if !p.is::<Killed>() {
            st.panic = Some(p);
        }
    }
    st.turn = Some(Turn::Runtime);
    baton.cv.notify_all();
}

/// Runs `fut` to completion on the current blocking task, handing the turn
/// back to the world whenever it must wait.
///
/// # Panics
/// If called outside a simulated blocking task (it would block the world).
pub fn block_on(mut fut: Pin<&mut dyn Future<Output = ()>>) {
    let baton = CURRENT
        .with(|c| c.borrow().clone())
        .expect("Env::block_on outside a blocking task of the simulated world would stop the world");
    let waker = Waker::from(Arc::new(BatonWaker(baton.clone())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if fut.as_mut().poll(&mut cx).is_ready() {
            return;
        }
        {
            let mut st = baton.lock();
            if st.woken {
                st.woken = false;
                continue;
            }
        }
        baton.park();
    }
}
