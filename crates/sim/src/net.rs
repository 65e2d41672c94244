//! The simulated network: connections as pairs of one-way pipes.
//!
//! Each pipe delivers its bytes in order (TCP's promise), each write as a
//! segment that arrives after a delay drawn from the seed — so segments of
//! different connections overtake each other. A pipe holds at most
//! [`WINDOW_BYTES`] in flight (a writer past it waits: back-pressure). A
//! partition between two hosts holds every segment between them, and every
//! connection attempt, until it heals (a TCP connection would retransmit
//! meanwhile; the endpoints' own deadlines decide whether they wait that
//! long). A reset fails both ends at once, and a crashed host's connections
//! are reset (the kernel closes a killed process's sockets).

use nasd_env::net::{SimListener, SimRead, SimWrite};
use nasd_env::{Listener, Stream};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Bytes a pipe holds in flight before its writer waits.
pub const WINDOW_BYTES: usize = 256 * 1024;
/// Largest segment one write makes.
pub const SEGMENT_BYTES_MAX: usize = 64 * 1024;
/// Connections a listener queues before it refuses more.
pub const BACKLOG_MAX: usize = 128;
/// First ephemeral port of a host.
const EPHEMERAL_PORT_MIN: u16 = 40_000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().expect("simulated network mutex poisoned")
}

/// How long segments take: `base` plus up to `jitter`, drawn per segment.
#[derive(Debug, Clone, Copy)]
pub struct Latency {
    /// The least delay.
    pub base: Duration,
    /// The most extra delay.
    pub jitter: Duration,
}

struct Segment {
    at: Instant,
    data: Vec<u8>,
    read: usize,
}

#[derive(Default)]
struct PipeState {
    segments: VecDeque<Segment>,
    in_flight: usize,
    /// The writer shut down: EOF after the last segment.
    closed: bool,
    /// The reading end is gone: writes fail.
    reader_gone: bool,
    reset: bool,
    reader: Option<Waker>,
    writer: Option<Waker>,
    last_at: Option<Instant>,
}

/// One direction of a connection.
struct Pipe {
    src: IpAddr,
    dst: IpAddr,
    state: Mutex<PipeState>,
}

/// Both directions of one connection: a reset fails both.
struct Conn {
    /// Client to server, and back.
    pipes: [Pipe; 2],
    /// A copy of what the client sent, if its host is tapped.
    tap: Option<Arc<Mutex<Vec<u8>>>>,
}

/// Most bytes recorded of one tapped connection.
pub const TAP_BYTES_MAX: usize = 1 << 20;
/// Tapped connections kept.
pub const TAPS_MAX: usize = 32;

impl Conn {
    fn reset(&self) {
        for p in &self.pipes {
            let mut s = lock(&p.state);
            s.reset = true;
            s.segments.clear();
            s.in_flight = 0;
            Pipe::wake_all(&mut s);
        }
    }
    fn is_reset(&self) -> bool {
        lock(&self.pipes[0].state).reset
    }
    fn touches(&self, host: IpAddr) -> bool {
        self.pipes[0].src == host || self.pipes[0].dst == host
    }
}

impl Pipe {
    fn wake_all(st: &mut PipeState) {
        if let Some(w) = st.reader.take() {
            w.wake();
        }
        if let Some(w) = st.writer.take() {
            w.wake();
        }
    }
}

struct ListenerState {
    queue: VecDeque<(Stream, SocketAddr)>,
    waker: Option<Waker>,
}

struct NetState {
    listeners: BTreeMap<SocketAddr, Arc<Mutex<ListenerState>>>,
    next_port: BTreeMap<IpAddr, u16>,
    /// Host pairs that cannot reach each other (smaller address first).
    partitions: BTreeSet<(IpAddr, IpAddr)>,
    conns: Vec<Weak<Conn>>,
    /// Hosts whose latency is raised (a slow link), and by how much.
    slow: BTreeMap<IpAddr, Duration>,
    /// Hosts whose outgoing connections are recorded, and the recordings.
    tapped: BTreeSet<IpAddr>,
    taps: VecDeque<(SocketAddr, Arc<Mutex<Vec<u8>>>)>,
    latency: Latency,
}

/// The network of one simulated world.
pub struct Net {
    state: Mutex<NetState>,
    healed: tokio::sync::Notify,
    rng: Arc<Mutex<rand::rngs::StdRng>>,
}

fn pair(a: IpAddr, b: IpAddr) -> (IpAddr, IpAddr) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

impl Net {
    /// A network whose delays are drawn from `rng`.
    pub fn new(latency: Latency, rng: Arc<Mutex<rand::rngs::StdRng>>) -> Arc<Net> {
        Arc::new(Net {
            state: Mutex::new(NetState {
                listeners: BTreeMap::new(),
                next_port: BTreeMap::new(),
                partitions: BTreeSet::new(),
                conns: Vec::new(),
                slow: BTreeMap::new(),
                tapped: BTreeSet::new(),
                taps: VecDeque::new(),
                latency,
            }),
            healed: tokio::sync::Notify::new(),
            rng,
        })
    }

    fn delay(&self, st: &NetState, src: IpAddr, dst: IpAddr) -> Duration {
        use rand::Rng;
        let jitter = st.latency.jitter.as_nanos() as u64;
        let extra = if jitter == 0 { 0 } else { lock(&self.rng).gen_range(0..=jitter) };
        let slow = st.slow.get(&src).copied().unwrap_or_default() + st.slow.get(&dst).copied().unwrap_or_default();
        st.latency.base + Duration::from_nanos(extra) + slow
    }

    /// True if `a` and `b` cannot reach each other now.
    pub fn partitioned(&self, a: IpAddr, b: IpAddr) -> bool {
        lock(&self.state).partitions.contains(&pair(a, b))
    }

    /// Cuts `a` off from `b`.
    pub fn partition(&self, a: IpAddr, b: IpAddr) {
        lock(&self.state).partitions.insert(pair(a, b));
    }

    /// Heals every partition; held segments go on their way.
    pub fn heal(&self) {
        for c in self.live_conns(|_| true) {
            for p in &c.pipes {
                Pipe::wake_all(&mut lock(&p.state));
            }
        }
        lock(&self.state).partitions.clear();
        self.healed.notify_waiters();
    }

    fn live_conns(&self, keep: impl Fn(&Conn) -> bool) -> Vec<Arc<Conn>> {
        let mut st = lock(&self.state);
        st.conns.retain(|c| c.strong_count() > 0);
        st.conns.iter().filter_map(Weak::upgrade).filter(|c| keep(c)).collect()
    }

    /// Adds `extra` to every segment to or from `host` (zero: back to normal).
    pub fn set_slow(&self, host: IpAddr, extra: Duration) {
        let mut st = lock(&self.state);
        if extra.is_zero() {
            st.slow.remove(&host);
        } else {
            st.slow.insert(host, extra);
        }
    }

    /// Resets every connection to or from `host` and closes its listeners
    /// (the host's process died). Returns how many connections were reset.
    pub fn crash_host(&self, host: IpAddr) -> usize {
        lock(&self.state).listeners.retain(|a, _| a.ip() != host);
        let conns = self.live_conns(|c| c.touches(host) && !c.is_reset());
        for c in &conns {
            c.reset();
        }
        conns.len()
    }

    /// Resets one live connection of `host` (the `pick`th, modulo their
    /// number); returns whether there was one.
    pub fn reset_one(&self, host: IpAddr, pick: usize) -> bool {
        let conns = self.live_conns(|c| c.touches(host) && !c.is_reset());
        match conns.get(pick % conns.len().max(1)) {
            Some(c) => {
                c.reset();
                true
            }
            None => false,
        }
    }

    /// Records what `host` sends on the connections it opens from now on
    /// (an eavesdropper on its link).
    pub fn tap(&self, host: IpAddr) {
        lock(&self.state).tapped.insert(host);
    }

    /// A recorded connection: where it went and what was sent.
    pub fn recording(&self, pick: usize) -> Option<(SocketAddr, Vec<u8>)> {
        let st = lock(&self.state);
        let (addr, bytes) = st.taps.get(pick % st.taps.len().max(1))?;
        let bytes = lock(bytes).clone();
        Some((*addr, bytes))
    }

    fn ephemeral(st: &mut NetState, host: IpAddr) -> u16 {
        let p = st.next_port.entry(host).or_insert(EPHEMERAL_PORT_MIN);
        let port = *p;
        *p = p.checked_add(1).unwrap_or(EPHEMERAL_PORT_MIN);
        port
    }

    /// Listens on `addr` for `host`.
    pub fn bind(self: &Arc<Self>, host: IpAddr, addr: SocketAddr) -> io::Result<Listener> {
        let mut st = lock(&self.state);
        let addr = if addr.port() == 0 { SocketAddr::new(host, Self::ephemeral(&mut st, host)) } else { addr };
        if addr.ip() != host && !addr.ip().is_unspecified() {
            return Err(io::Error::new(io::ErrorKind::AddrNotAvailable, format!("{} is not this host's", addr.ip())));
        }
        let addr = SocketAddr::new(host, addr.port());
        if st.listeners.contains_key(&addr) {
            return Err(io::Error::new(io::ErrorKind::AddrInUse, format!("{addr} is in use")));
        }
        let state = Arc::new(Mutex::new(ListenerState { queue: VecDeque::new(), waker: None }));
        st.listeners.insert(addr, state.clone());
        Ok(Listener::simulated(Box::new(SimListenerImpl { net: self.clone(), addr, state })))
    }

    /// Connects `host` to `addr`: after a delay, a connection, or
    /// `ConnectionRefused` if nothing listens there. Waits while partitioned.
    pub async fn connect(self: Arc<Self>, host: IpAddr, addr: SocketAddr) -> io::Result<Stream> {
        loop {
            let healed = self.healed.notified();
            if !self.partitioned(host, addr.ip()) {
                break;
            }
            healed.await;
        }
        let d = { self.delay(&lock(&self.state), host, addr.ip()) };
        tokio::time::sleep(d).await;
        let mut st = lock(&self.state);
        let Some(listener) = st.listeners.get(&addr).cloned() else {
            return Err(io::Error::new(io::ErrorKind::ConnectionRefused, format!("nothing listens on {addr}")));
        };
        let local = SocketAddr::new(host, Self::ephemeral(&mut st, host));
        let tap = st.tapped.contains(&host).then(|| Arc::new(Mutex::new(Vec::new())));
        if let Some(t) = &tap {
            if st.taps.len() == TAPS_MAX {
                st.taps.pop_front();
            }
            st.taps.push_back((addr, t.clone()));
        }
        let conn = Arc::new(Conn {
            pipes: [
                Pipe { src: host, dst: addr.ip(), state: Mutex::default() },
                Pipe { src: addr.ip(), dst: host, state: Mutex::default() },
            ],
            tap,
        });
        st.conns.push(Arc::downgrade(&conn));
        drop(st);
        let end = |read: usize| {
            (
                Box::new(ReadEnd { conn: conn.clone(), dir: read, net: self.clone(), sleep: None }) as Box<dyn SimRead>,
                Box::new(WriteEnd { conn: conn.clone(), dir: 1 - read, net: self.clone() }) as Box<dyn SimWrite>,
            )
        };
        let (crd, cwr) = end(1);
        let (srd, swr) = end(0);
        let client = Stream::simulated(crd, cwr, local, addr);
        let server = Stream::simulated(srd, swr, addr, local);
        let mut l = lock(&listener);
        if l.queue.len() >= BACKLOG_MAX {
            return Err(io::Error::new(io::ErrorKind::ConnectionRefused, format!("{addr}'s backlog is full")));
        }
        l.queue.push_back((server, local));
        if let Some(w) = l.waker.take() {
            w.wake();
        }
        Ok(client)
    }
}

struct SimListenerImpl {
    net: Arc<Net>,
    addr: SocketAddr,
    state: Arc<Mutex<ListenerState>>,
}

impl SimListener for SimListenerImpl {
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(Stream, SocketAddr)>> {
        let mut st = lock(&self.state);
        match st.queue.pop_front() {
            Some(c) => Poll::Ready(Ok(c)),
            None => {
                st.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

impl Drop for SimListenerImpl {
    fn drop(&mut self) {
        let mut st = lock(&self.net.state);
        if st.listeners.get(&self.addr).is_some_and(|l| Arc::ptr_eq(l, &self.state)) {
            st.listeners.remove(&self.addr);
        }
    }
}

/// The receiving end of a connection.
struct ReadEnd {
    conn: Arc<Conn>,
    /// Which pipe of `conn` this end reads.
    dir: usize,
    net: Arc<Net>,
    sleep: Option<Pin<Box<Sleep>>>,
}

fn reset_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "simulated connection reset")
}

impl AsyncRead for ReadEnd {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let pipe = &self.conn.pipes[self.dir];
            let partitioned = self.net.partitioned(pipe.src, pipe.dst);
            let mut st = lock(&pipe.state);
            if st.reset {
                return Poll::Ready(Err(reset_error()));
            }
            let Some(front) = st.segments.front_mut() else {
                if st.closed {
                    return Poll::Ready(Ok(()));
                }
                st.reader = Some(cx.waker().clone());
                return Poll::Pending;
            };
            if partitioned {
                st.reader = Some(cx.waker().clone());
                return Poll::Pending;
            }
            if front.at <= Instant::now() {
                let n = buf.remaining().min(front.data.len() - front.read);
                buf.put_slice(&front.data[front.read..front.read + n]);
                front.read += n;
                if front.read == front.data.len() {
                    let seg = st.segments.pop_front().expect("front");
                    st.in_flight -= seg.data.len();
                    if let Some(w) = st.writer.take() {
                        w.wake();
                    }
                }
                drop(st);
                self.sleep = None;
                return Poll::Ready(Ok(()));
            }
            let at = front.at;
            st.reader = Some(cx.waker().clone());
            drop(st);
            let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
            if sleep.deadline() != at {
                sleep.as_mut().reset(at);
            }
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        }
    }
}

impl SimRead for ReadEnd {
    fn is_open_and_idle(&self) -> bool {
        let st = lock(&self.conn.pipes[self.dir].state);
        !st.reset && !st.closed && st.segments.is_empty()
    }
}

impl Drop for ReadEnd {
    /// Closing the reading end: the peer's later writes fail (a RST).
    fn drop(&mut self) {
        let mut st = lock(&self.conn.pipes[self.dir].state);
        st.reader_gone = true;
        st.segments.clear();
        st.in_flight = 0;
        Pipe::wake_all(&mut st);
    }
}

/// The sending end of a connection.
struct WriteEnd {
    conn: Arc<Conn>,
    /// Which pipe of `conn` this end writes.
    dir: usize,
    net: Arc<Net>,
}

impl WriteEnd {
    fn pipe(&self) -> &Pipe {
        &self.conn.pipes[self.dir]
    }
}

impl AsyncWrite for WriteEnd {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let (net, pipe) = (&self.net, self.pipe());
        let delay = net.delay(&lock(&net.state), pipe.src, pipe.dst);
        let mut st = lock(&pipe.state);
        if st.reset {
            return Poll::Ready(Err(reset_error()));
        }
        if st.reader_gone {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, "the peer closed the connection")));
        }
        if st.closed {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, "write after shutdown")));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if st.in_flight >= WINDOW_BYTES {
            st.writer = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = buf.len().min(WINDOW_BYTES - st.in_flight).min(SEGMENT_BYTES_MAX);
        let now = Instant::now();
        let at = (now + delay).max(st.last_at.unwrap_or(now));
        st.last_at = Some(at);
        st.segments.push_back(Segment { at, data: buf[..n].to_vec(), read: 0 });
        st.in_flight += n;
        if let (0, Some(tap)) = (self.dir, &self.conn.tap) {
            let mut t = lock(tap);
            let room = TAP_BYTES_MAX.saturating_sub(t.len()).min(n);
            t.extend_from_slice(&buf[..room]);
        }
        if let Some(w) = st.reader.take() {
            w.wake();
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if lock(&self.pipe().state).reset {
            return Poll::Ready(Err(reset_error()));
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = lock(&self.pipe().state);
        st.closed = true;
        if let Some(w) = st.reader.take() {
            w.wake();
        }
        Poll::Ready(Ok(()))
    }
}

impl SimWrite for WriteEnd {}

impl Drop for WriteEnd {
    /// Dropping the sending end closes it (FIN after what is in flight).
    fn drop(&mut self) {
        let mut st = lock(&self.pipe().state);
        st.closed = true;
        if let Some(w) = st.reader.take() {
            w.wake();
        }
    }
}
