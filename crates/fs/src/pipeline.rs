//! A logged-in manager connection carrying up to
//! [`CONNECTION_REQUESTS_MAX`] requests at once (the manager protocol's
//! pipelining: each reply echoes its request's id and replies may come back
//! in any order).
//!
//! One task writes the requests in the order they are handed over, one
//! reads the replies and hands each to the request it answers, so a caller
//! that stops waiting (its future dropped) never leaves half a request on
//! the stream: its reply is read and discarded. Any failure of the stream —
//! the manager gone, a reply that does not decode or answers no request, a
//! request or reply that does not finish within the wait bound, an answer
//! that does not come within it — ends the connection, and every request
//! in flight on it fails as unanswered (it may or may not have been
//! carried out: the pool's rules for resending apply to each).

use crate::FsError;
use nasd_proto::manager::{
    ManagerReply, ManagerRequest, CONNECTION_REQUESTS_MAX, MANAGER_MESSAGE_MAX, MANAGER_PROTOCOL_VERSION_TRACE,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

/// What a request's waiter gets: the decoded reply, or why none came.
type Answer = Result<Result<ManagerReply, (nasd_proto::fs::FsStatus, String)>, String>;

/// How one request on a pipeline ended.
pub(crate) enum Outcome {
    /// The manager answered (a refusal included).
    Answered(Result<ManagerReply, FsError>),
    /// No answer: the connection ended (it may or may not have been carried out).
    Lost(FsError),
    /// Never sent: a limit the request breaks, or the manager did not take
    /// it in time.
    NotSent(FsError),
    /// Never sent: the connection had ended (another connection may take it).
    Ended,
}

/// State the reading and writing tasks share with the callers.
struct Shared {
    /// Requests sent and not answered yet, by id.
    pending: Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
    /// Ids below this were handed out.
    next_id: AtomicU64,
    /// Set once the connection ended.
    ended: AtomicBool,
}

impl Shared {
    /// Ends the connection: every request in flight fails with `why`.
    /// (`ended` is set under the `pending` lock, so no request is added
    /// to `pending` after the drain and left waiting.)
    fn end(&self, why: &str) {
        let waiting: Vec<_> = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            if self.ended.swap(true, Ordering::SeqCst) {
                return;
            }
            pending.drain().collect()
        };
        for (_, tx) in waiting {
            let _ = tx.send(Err(why.to_string()));
        }
    }

    /// Registers request `id` for its reply, unless the connection ended.
    fn await_reply(&self, id: u64, tx: oneshot::Sender<Answer>) -> Result<(), ()> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if self.ended.load(Ordering::SeqCst) {
            return Err(());
        }
        pending.insert(id, tx);
        Ok(())
    }
}

/// A logged-in connection with requests in flight together.
pub(crate) struct Pipeline {
    frames: mpsc::Sender<Vec<u8>>,
    shared: Arc<Shared>,
    /// One permit per request in flight, [`CONNECTION_REQUESTS_MAX`] in all.
    permits: Semaphore,
    /// The manager's address and how long each wait for it may take.
    pub(crate) deadline: (String, Duration),
    /// The generation of the identity it logged in with.
    pub(crate) generation: u64,
    /// The manager protocol version the connection logged in with: it
    /// sends `TRACED` envelopes only from [`MANAGER_PROTOCOL_VERSION_TRACE`] on.
    protocol: u8,
    /// When a request last finished on it.
    last_used: Mutex<Instant>,
    tasks: [JoinHandle<()>; 2],
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.shared.end("the connection was closed");
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Pipeline {
    /// Starts the reading and writing tasks on a `stream` logged in with
    /// manager protocol version `protocol`, whose next request id is `next_id`.
    pub(crate) fn start<S>(
        stream: S,
        next_id: u64,
        deadline: (String, Duration),
        generation: u64,
        protocol: u8,
    ) -> Pipeline
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (reader, writer) = tokio::io::split(stream);
        let shared = Arc::new(Shared {
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(next_id),
            ended: AtomicBool::new(false),
        });
        let (frames, to_write) = mpsc::channel(CONNECTION_REQUESTS_MAX);
        let writing = tokio::spawn(write_requests(writer, to_write, shared.clone(), deadline.clone()));
        let reading = tokio::spawn(read_replies(reader, shared.clone(), deadline.clone()));
        Pipeline {
            frames,
            shared,
            permits: Semaphore::new(CONNECTION_REQUESTS_MAX),
            deadline,
            generation,
            protocol,
            last_used: Mutex::new(Instant::now()),
            tasks: [writing, reading],
        }
    }

    /// Whether the connection ended (nothing more can go out on it).
    pub(crate) fn has_ended(&self) -> bool {
        self.shared.ended.load(Ordering::SeqCst)
    }

    /// Requests in flight on it now (those waiting for a turn not counted).
    pub(crate) fn in_flight(&self) -> usize {
        CONNECTION_REQUESTS_MAX - self.permits.available_permits()
    }

    /// How long since a request last finished on it, if none is in flight.
    pub(crate) fn idle_for(&self) -> Option<Duration> {
        (self.in_flight() == 0).then(|| self.last_used.lock().unwrap_or_else(|p| p.into_inner()).elapsed())
    }

    /// Sends `req` and waits for its answer, each wait within the bound.
    ///
    /// # Cancel safety
    /// Cancel safe: the request goes out whole or not at all, and a reply
    /// nobody waits for any more is read and dropped.
    pub(crate) async fn call(&self, req: &ManagerRequest) -> Outcome {
        if let Err(e) = crate::conn::within_limits(req) {
            return Outcome::NotSent(e);
        }
        let (addr, limit) = &self.deadline;
        let Ok(Ok(permit)) = tokio::time::timeout(*limit, self.permits.acquire()).await else {
            return Outcome::NotSent(FsError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the manager at {addr} did not take the request within {limit:?}"),
            )));
        };
        let id = self.shared.next_id.fetch_add(1, Ordering::SeqCst);
        // The operation's trace id, if it has one, in a TRACED envelope where the session's
        // version has them; to an older manager the id stays on the client's and the drives'
        // side (docs/PROTOCOL.md, "Manager protocol versions").
        let trace = nasd_client::trace::current().filter(|_| self.protocol >= MANAGER_PROTOCOL_VERSION_TRACE);
        let body = match trace {
            Some(trace) => req.encode_traced(id, &trace),
            None => req.encode(id),
        };
        if body.len() > MANAGER_MESSAGE_MAX {
            return Outcome::NotSent(FsError::Protocol("request over MANAGER_MESSAGE_MAX".into()));
        }
        let (tx, rx) = oneshot::channel();
        if self.shared.await_reply(id, tx).is_err() {
            return Outcome::Ended;
        }
        // Forgets the request if the caller stops waiting: its reply is then dropped.
        let _forget = Forget { shared: &self.shared, id };
        if self.frames.send(body).await.is_err() {
            // The writing task ended before it took the request: nothing of it went out.
            return Outcome::Ended;
        }
        let outcome = match tokio::time::timeout(*limit, rx).await {
            Ok(Ok(Ok(result))) => {
                Outcome::Answered(result.map_err(|(status, message)| FsError::Fs { status, message }))
            }
            Ok(Ok(Err(why))) => Outcome::Lost(self.lost(&why)),
            Ok(Err(_)) => Outcome::Lost(self.lost("the connection ended")),
            Err(_) => {
                let why = format!("the manager at {addr} did not answer within {limit:?}");
                self.shared.end(&why);
                Outcome::Lost(FsError::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, why)))
            }
        };
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        drop(permit);
        outcome
    }

    fn lost(&self, why: &str) -> FsError {
        FsError::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            format!("no reply from the manager at {}: {why}", self.deadline.0),
        ))
    }
}

/// Removes a request from the pending ones when its caller is done with it.
struct Forget<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.shared.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}

/// Writes the requests handed over, in order, each within the bound.
async fn write_requests<W: AsyncWrite>(
    writer: W,
    mut frames: mpsc::Receiver<Vec<u8>>,
    shared: Arc<Shared>,
    (addr, limit): (String, Duration),
) {
    tokio::pin!(writer);
    while let Some(body) = frames.recv().await {
        let write = async {
            writer.write_all(&(body.len() as u32).to_le_bytes()).await?;
            writer.write_all(&body).await?;
            writer.flush().await
        };
        let why = match tokio::time::timeout(limit, write).await {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => format!("sending a request to the manager at {addr} failed: {e}"),
            Err(_) => format!("the manager at {addr} did not take the request within {limit:?}"),
        };
        shared.end(&why);
        return;
    }
}

/// Reads replies and hands each to its request, until the stream fails.
async fn read_replies<R: AsyncRead>(reader: R, shared: Arc<Shared>, (addr, limit): (String, Duration)) {
    tokio::pin!(reader);
    let why = loop {
        let mut len = [0u8; 4];
        // Between replies the connection may sit idle: each caller bounds its own wait.
        if let Err(e) = reader.read_exact(&mut len).await {
            break format!("the manager at {addr} closed the connection: {e}");
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > MANAGER_MESSAGE_MAX {
            break format!("reply of {len} bytes is over MANAGER_MESSAGE_MAX");
        }
        let mut body = vec![0u8; len];
        match tokio::time::timeout(limit, reader.read_exact(&mut body)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => break format!("the manager at {addr} did not send the whole reply it announced: {e}"),
            Err(_) => {
                break format!("the manager at {addr} did not send the whole reply it announced within {limit:?}")
            }
        }
        let (id, result) = match ManagerReply::decode(&body) {
            Ok(decoded) => decoded,
            Err(e) => break format!("a reply from the manager at {addr} does not decode: {e}"),
        };
        if id >= shared.next_id.load(Ordering::SeqCst) {
            break format!("the manager at {addr} answered request {id}, never sent");
        }
        // A request whose caller stopped waiting is no longer pending: its reply is dropped.
        let waiter = shared.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        if let Some(tx) = waiter {
            let _ = tx.send(Ok(result));
        }
    };
    shared.end(&why);
}
