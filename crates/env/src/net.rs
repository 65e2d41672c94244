//! The network: listeners and byte streams.
//!
//! In the real environment a [`Stream`] is a `TcpStream` and its halves are
//! tokio's owned halves: the enum's one branch per call is the whole cost. A
//! simulated world supplies its own halves ([`SimRead`], [`SimWrite`]) and
//! listener ([`SimListener`]).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The receiving half of a simulated connection.
pub trait SimRead: AsyncRead + Send + Sync + Unpin + 'static {
    /// True if the connection is open and nothing has arrived on it (the
    /// test [`ReadHalf::is_open_and_idle`] makes without waiting).
    fn is_open_and_idle(&self) -> bool;
}

/// The sending half of a simulated connection.
pub trait SimWrite: AsyncWrite + Send + Sync + Unpin + 'static {}

/// A simulated listener.
pub trait SimListener: Send + Sync + 'static {
    /// Polls for the next connection.
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(Stream, SocketAddr)>>;
    /// The address listened on.
    fn local_addr(&self) -> io::Result<SocketAddr>;
}

/// A connected byte stream.
pub struct Stream(StreamInner);

enum StreamInner {
    Tcp(tokio::net::TcpStream),
    Sim { rd: Box<dyn SimRead>, wr: Box<dyn SimWrite>, local: SocketAddr, peer: SocketAddr },
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            StreamInner::Tcp(s) => s.fmt(f),
            StreamInner::Sim { local, peer, .. } => write!(f, "Stream(simulated {local} -> {peer})"),
        }
    }
}

impl From<tokio::net::TcpStream> for Stream {
    fn from(s: tokio::net::TcpStream) -> Self {
        Stream(StreamInner::Tcp(s))
    }
}

impl Stream {
    /// A simulated connection from its halves.
    pub fn simulated(rd: Box<dyn SimRead>, wr: Box<dyn SimWrite>, local: SocketAddr, peer: SocketAddr) -> Stream {
        Stream(StreamInner::Sim { rd, wr, local, peer })
    }

    /// Sets `TCP_NODELAY` (nothing to set on a simulated connection).
    ///
    /// # Errors
    /// As `TcpStream::set_nodelay`.
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        match &self.0 {
            StreamInner::Tcp(s) => s.set_nodelay(on),
            StreamInner::Sim { .. } => Ok(()),
        }
    }

    /// The peer's address.
    ///
    /// # Errors
    /// As `TcpStream::peer_addr`.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        match &self.0 {
            StreamInner::Tcp(s) => s.peer_addr(),
            StreamInner::Sim { peer, .. } => Ok(*peer),
        }
    }

    /// This end's address.
    ///
    /// # Errors
    /// As `TcpStream::local_addr`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.0 {
            StreamInner::Tcp(s) => s.local_addr(),
            StreamInner::Sim { local, .. } => Ok(*local),
        }
    }

    /// The TCP stream, if this is one.
    pub fn as_tcp(&self) -> Option<&tokio::net::TcpStream> {
        match &self.0 {
            StreamInner::Tcp(s) => Some(s),
            StreamInner::Sim { .. } => None,
        }
    }

    /// True if the connection is open and nothing has arrived on it, found
    /// without waiting ([`ReadHalf::is_open_and_idle`]).
    pub fn is_open_and_idle(&self) -> bool {
        match &self.0 {
            StreamInner::Tcp(s) => tcp_open_and_idle(s),
            StreamInner::Sim { rd, .. } => rd.is_open_and_idle(),
        }
    }

    /// A probe of this connection that another task can ask, while this
    /// one reads and writes, whether it is open and idle
    /// ([`StreamProbe::is_open_and_idle`]); `None` for a simulated one.
    /// The probe holds its own descriptor of the socket: the connection
    /// closes (the peer sees it) only once both are dropped.
    ///
    /// # Errors
    /// The socket's descriptor cannot be duplicated.
    pub fn probe(&self) -> io::Result<Option<StreamProbe>> {
        match &self.0 {
            StreamInner::Tcp(s) => Ok(Some(StreamProbe(socket2::SockRef::from(s).try_clone()?))),
            StreamInner::Sim { .. } => Ok(None),
        }
    }

    /// Splits into halves that can be used from different tasks.
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self.0 {
            StreamInner::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadHalf(ReadInner::Tcp(r)), WriteHalf(WriteInner::Tcp(w)))
            }
            StreamInner::Sim { rd, wr, .. } => (ReadHalf(ReadInner::Sim(rd)), WriteHalf(WriteInner::Sim(wr))),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            StreamInner::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            StreamInner::Sim { rd, .. } => Pin::new(rd).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().0 {
            StreamInner::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            StreamInner::Sim { wr, .. } => Pin::new(wr).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            StreamInner::Tcp(s) => Pin::new(s).poll_flush(cx),
            StreamInner::Sim { wr, .. } => Pin::new(wr).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            StreamInner::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            StreamInner::Sim { wr, .. } => Pin::new(wr).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().0 {
            StreamInner::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            StreamInner::Sim { wr, .. } => Pin::new(wr).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match &self.0 {
            StreamInner::Tcp(s) => s.is_write_vectored(),
            StreamInner::Sim { wr, .. } => wr.is_write_vectored(),
        }
    }
}

/// The receiving half of a [`Stream`].
pub struct ReadHalf(ReadInner);

enum ReadInner {
    Tcp(tokio::net::tcp::OwnedReadHalf),
    Sim(Box<dyn SimRead>),
}

impl std::fmt::Debug for ReadHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReadHalf")
    }
}

impl ReadHalf {
    /// True if the connection is open and nothing has arrived on it, found
    /// without waiting (a TCP socket is peeked: "would block" means open and
    /// empty). False once the peer closed or reset it, or sent bytes.
    pub fn is_open_and_idle(&self) -> bool {
        match &self.0 {
            ReadInner::Tcp(r) => tcp_open_and_idle(r.as_ref()),
            ReadInner::Sim(r) => r.is_open_and_idle(),
        }
    }
}

/// A TCP socket is peeked: "would block" means open and empty.
fn tcp_open_and_idle(s: &tokio::net::TcpStream) -> bool {
    socket_open_and_idle(&socket2::SockRef::from(s))
}

/// Open (no end of stream, no error) and nothing waiting to be read.
fn socket_open_and_idle(socket: &socket2::Socket) -> bool {
    let mut probe = [std::mem::MaybeUninit::uninit()];
    // Never blocks: tokio's sockets are non-blocking, and a duplicated
    // descriptor shares that flag with the original.
    matches!(socket.peek(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// Asks, from anywhere, whether a TCP connection is open and idle
/// ([`Stream::probe`]).
#[derive(Debug)]
pub struct StreamProbe(socket2::Socket);

impl StreamProbe {
    /// True if the connection is open and nothing has arrived on it that
    /// its reader has not taken, found without waiting: false once the peer
    /// closed it or sent anything.
    pub fn is_open_and_idle(&self) -> bool {
        socket_open_and_idle(&self.0)
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            ReadInner::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            ReadInner::Sim(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

/// The sending half of a [`Stream`].
pub struct WriteHalf(WriteInner);

enum WriteInner {
    Tcp(tokio::net::tcp::OwnedWriteHalf),
    Sim(Box<dyn SimWrite>),
}

impl std::fmt::Debug for WriteHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WriteHalf")
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().0 {
            WriteInner::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            WriteInner::Sim(s) => Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            WriteInner::Tcp(s) => Pin::new(s).poll_flush(cx),
            WriteInner::Sim(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            WriteInner::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            WriteInner::Sim(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().0 {
            WriteInner::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            WriteInner::Sim(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match &self.0 {
            WriteInner::Tcp(s) => s.is_write_vectored(),
            WriteInner::Sim(s) => s.is_write_vectored(),
        }
    }
}

/// A listening socket.
pub struct Listener(ListenerInner);

enum ListenerInner {
    Tcp(tokio::net::TcpListener),
    Sim(Box<dyn SimListener>),
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            ListenerInner::Tcp(l) => l.fmt(f),
            ListenerInner::Sim(_) => f.write_str("Listener(simulated)"),
        }
    }
}

impl From<tokio::net::TcpListener> for Listener {
    fn from(l: tokio::net::TcpListener) -> Self {
        Listener(ListenerInner::Tcp(l))
    }
}

impl Listener {
    /// A simulated listener.
    pub fn simulated(l: Box<dyn SimListener>) -> Listener {
        Listener(ListenerInner::Sim(l))
    }

    /// Waits for the next connection.
    ///
    /// # Errors
    /// As `TcpListener::accept`.
    ///
    /// # Cancel safety
    /// Cancel safe, as `TcpListener::accept`: a connection is never lost.
    pub async fn accept(&self) -> io::Result<(Stream, SocketAddr)> {
        match &self.0 {
            ListenerInner::Tcp(l) => l.accept().await.map(|(s, a)| (Stream::from(s), a)),
            ListenerInner::Sim(l) => std::future::poll_fn(|cx| l.poll_accept(cx)).await,
        }
    }

    /// The address listened on.
    ///
    /// # Errors
    /// As `TcpListener::local_addr`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.0 {
            ListenerInner::Tcp(l) => l.local_addr(),
            ListenerInner::Sim(l) => l.local_addr(),
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_real_connection_carries_bytes_and_tells_when_its_peer_closed() {
        let env = crate::Env::real();
        let listener = env.bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = env.connect(addr).await.unwrap();
        let (server, peer) = listener.accept().await.unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        assert_eq!(client.peer_addr().unwrap(), addr);
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        assert!(cr.is_open_and_idle());
        cw.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        sr.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        sw.write_all(b"pong").await.unwrap();
        sw.shutdown().await.unwrap();
        drop((sr, sw));
        cr.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        // Closed by the peer: no longer idle.
        let mut rest = Vec::new();
        cr.read_to_end(&mut rest).await.unwrap();
        assert!(!cr.is_open_and_idle());
    }
}
