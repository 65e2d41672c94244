//! The TCP side: RPC record marking (RFC 5531 §11), one task per
//! connection reading records, calls run concurrently (at most
//! [`CALLS_PER_CONNECTION_MAX`] at once), replies written as they finish.

use crate::fs::{Auth, Caller, NfsFileSystem};
use crate::rpc::{
    auth_flavor, auth_stat, auth_unix, call_body, garbage_args_reply_message, prog_mismatch_reply_message,
    prog_unavail_reply_message, rejected_reply, reply_body, rpc_body, rpc_msg, rpc_vers_mismatch,
};
use crate::xdr::XDR;
use crate::{mount, nfs, procs, RECORD_BYTES_MAX};
use std::io::Cursor;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Calls one connection runs at once; the next record waits to be read.
pub const CALLS_PER_CONNECTION_MAX: usize = 16;
/// Connections served at once; more are closed at accept.
pub const CONNECTIONS_MAX: usize = 256;
/// Calls running at once over all connections; a connection's next record
/// waits. With [`CONNECTIONS_MAX`] records being read, memory for calls is
/// bounded by about `(CALLS_IN_FLIGHT_MAX * 2 + CONNECTIONS_MAX) * RECORD_BYTES_MAX`
/// (a record and its reply per call): under 1 GiB.
pub const CALLS_IN_FLIGHT_MAX: usize = 256;
/// Longest AUTH_SYS credential body (RFC 5531: 400 bytes).
const AUTH_BODY_MAX: usize = 400;

/// Whether a peer may talk to the server at all (its allowed networks).
pub trait PeerFilter: Send + Sync + 'static {
    /// `true` if `peer` is served.
    fn allows(&self, peer: &SocketAddr) -> bool;
}

/// Serves NFSv3 and MOUNT v3 on `listener` for `fs` until `shutdown`
/// completes; connections from peers `filter` refuses are closed at once.
///
/// # Errors
/// Accepting a connection failed.
pub async fn serve(
    listener: TcpListener,
    fs: Arc<dyn NfsFileSystem>,
    filter: Arc<dyn PeerFilter>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let connections = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    let in_flight = Arc::new(tokio::sync::Semaphore::new(CALLS_IN_FLIGHT_MAX));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = &mut shutdown => return Ok(()),
        };
        if !filter.allows(&peer) {
            tracing::warn!(%peer, "refusing an NFS connection from outside the allowed client networks");
            continue;
        }
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "refusing an NFS connection: {CONNECTIONS_MAX} are open");
            continue;
        };
        let (fs, in_flight) = (fs.clone(), in_flight.clone());
        tokio::spawn(async move {
            if let Err(e) = connection(stream, peer, fs, in_flight).await {
                tracing::debug!(%peer, error = %e, "NFS connection ended");
            }
            drop(permit);
        });
    }
}

/// Reads records from one connection and answers each.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    fs: Arc<dyn NfsFileSystem>,
    in_flight: Arc<tokio::sync::Semaphore>,
) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let (mut read, mut write) = stream.into_split();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(CALLS_PER_CONNECTION_MAX);
    let writer = tokio::spawn(async move {
        while let Some(reply) = rx.recv().await {
            let mark = u32::try_from(reply.len()).expect("replies are far below 2^31") | 1 << 31;
            if write.write_all(&mark.to_be_bytes()).await.is_err() || write.write_all(&reply).await.is_err() {
                break;
            }
        }
    });
    let calls = Arc::new(tokio::sync::Semaphore::new(CALLS_PER_CONNECTION_MAX));
    let result = loop {
        let record = match read_record(&mut read).await {
            Ok(Some(r)) => r,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        let permit = calls.clone().acquire_owned().await.expect("never closed");
        let global = in_flight.clone().acquire_owned().await.expect("never closed");
        let (fs, tx) = (fs.clone(), tx.clone());
        tokio::spawn(async move {
            if let Some(reply) = answer(&record, peer, fs.as_ref()).await {
                let _ = tx.send(reply).await;
            }
            drop((permit, global));
        });
    };
    drop(tx);
    let _ = writer.await;
    result
}

/// One record (its fragments joined), at most [`RECORD_BYTES_MAX`]; `None`
/// at a clean end of the stream.
async fn read_record(read: &mut (impl AsyncReadExt + Unpin)) -> std::io::Result<Option<Vec<u8>>> {
    let mut record = Vec::new();
    loop {
        let mut mark = [0u8; 4];
        match read.read_exact(&mut mark).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && record.is_empty() => return Ok(None),
            Err(e) => return Err(e),
        }
        let mark = u32::from_be_bytes(mark);
        let last = mark & 1 << 31 != 0;
        let len = (mark & !(1 << 31)) as usize;
        if record.len() + len > RECORD_BYTES_MAX {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "an RPC record over RECORD_BYTES_MAX"));
        }
        let start = record.len();
        record.resize(start + len, 0);
        read.read_exact(&mut record[start..]).await?;
        if last {
            return Ok(Some(record));
        }
    }
}

/// The reply to one call record; `None` for a record that is not a call
/// (nothing to answer).
async fn answer(record: &[u8], peer: SocketAddr, fs: &dyn NfsFileSystem) -> Option<Vec<u8>> {
    let mut input = Cursor::new(record);
    let mut msg = rpc_msg::default();
    if let Err(e) = msg.deserialize(&mut input) {
        tracing::debug!(%peer, error = %e, "dropping an RPC record that does not decode");
        return None;
    }
    let xid = msg.xid;
    let rpc_body::CALL(call) = msg.body else { return None };
    let mut output = Vec::new();
    let Some(auth) = credentials(&call) else {
        tracing::debug!(%peer, xid, "refusing a call whose AUTH_SYS credential does not decode");
        let denied = rpc_msg {
            xid,
            body: rpc_body::REPLY(reply_body::MSG_DENIED(rejected_reply::AUTH_ERROR(auth_stat::AUTH_BADCRED))),
        };
        denied.serialize(&mut output).ok()?;
        return Some(output);
    };
    let caller = Caller { peer, auth };
    let result = dispatch(xid, &call, &caller, &mut input, &mut output, fs).await;
    if let Err(e) = result {
        tracing::debug!(%peer, xid, error = %e, "an RPC call's arguments do not decode");
        output.clear();
        garbage_args_reply_message(xid).serialize(&mut output).ok()?;
    }
    Some(output)
}

/// The call's credentials; `None` (refused `AUTH_BADCRED`) if its AUTH_SYS
/// body is too long, does not decode or names more than 16 groups.
fn credentials(call: &call_body) -> Option<Auth> {
    match call.cred.flavor {
        auth_flavor::AUTH_UNIX => {
            if call.cred.body.len() > AUTH_BODY_MAX {
                return None;
            }
            let mut unix = auth_unix::default();
            unix.deserialize(&mut Cursor::new(&call.cred.body)).ok()?;
            if unix.gids.len() > 16 {
                return None;
            }
            Some(Auth::Sys { uid: unix.uid, gid: unix.gid, groups: unix.gids })
        }
        _ => Some(Auth::None),
    }
}

async fn dispatch(
    xid: u32,
    call: &call_body,
    caller: &Caller,
    input: &mut Cursor<&[u8]>,
    output: &mut Vec<u8>,
    fs: &dyn NfsFileSystem,
) -> std::io::Result<()> {
    if call.rpcvers != 2 {
        return rpc_vers_mismatch(xid).serialize(output);
    }
    match call.prog {
        nfs::PROGRAM if call.vers == nfs::VERSION => procs::nfs(xid, call.proc, caller, input, output, fs).await,
        nfs::PROGRAM => prog_mismatch_reply_message(xid, nfs::VERSION).serialize(output),
        mount::PROGRAM if call.vers == mount::VERSION => procs::mount(xid, call.proc, caller, input, output, fs).await,
        mount::PROGRAM => prog_mismatch_reply_message(xid, mount::VERSION).serialize(output),
        _ => prog_unavail_reply_message(xid).serialize(output),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(len: u32, last: bool) -> [u8; 4] {
        (len | if last { 1 << 31 } else { 0 }).to_be_bytes()
    }

    #[tokio::test]
    async fn records_join_their_fragments_and_an_oversized_one_is_refused_before_it_is_read() {
        let mut stream = Vec::new();
        stream.extend_from_slice(&mark(3, false));
        stream.extend_from_slice(b"abc");
        stream.extend_from_slice(&mark(2, true));
        stream.extend_from_slice(b"de");
        let mut r = &stream[..];
        assert_eq!(read_record(&mut r).await.unwrap(), Some(b"abcde".to_vec()));
        assert_eq!(read_record(&mut r).await.unwrap(), None, "a clean end");

        // Two fragments that together pass RECORD_BYTES_MAX: refused at the second mark.
        let half = (RECORD_BYTES_MAX / 2 + 1) as u32;
        let mut stream = mark(half, false).to_vec();
        stream.resize(4 + half as usize, 0);
        stream.extend_from_slice(&mark(half, true));
        let mut r = &stream[..];
        let e = read_record(&mut r).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        // A 2^31 - 1 byte fragment announced by a 4-byte stream is refused without allocating it.
        let mut r = &mark(u32::MAX >> 1, true)[..];
        assert_eq!(read_record(&mut r).await.unwrap_err().kind(), std::io::ErrorKind::InvalidData);
        // A stream cut inside a record is an error, not a clean end.
        let mut cut = mark(5, true).to_vec();
        cut.extend_from_slice(b"ab");
        let mut r = &cut[..];
        assert!(read_record(&mut r).await.is_err());
    }

    #[test]
    fn opaques_and_arrays_over_their_limits_are_refused_before_allocation() {
        let mut v: Vec<u8> = Vec::new();
        let len = (crate::xdr::OPAQUE_BYTES_MAX as u32 + 1).to_be_bytes();
        assert!(v.deserialize(&mut Cursor::new(&len[..])).is_err());
        let mut a: Vec<u32> = Vec::new();
        let len = (crate::xdr::U32_ARRAY_MAX as u32 + 1).to_be_bytes();
        assert!(a.deserialize(&mut Cursor::new(&len[..])).is_err());
        let ok = [0, 0, 0, 3, b'a', b'b', b'c', 0];
        v.deserialize(&mut Cursor::new(&ok[..])).unwrap();
        assert_eq!(v, b"abc");
    }
}
