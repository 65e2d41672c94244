//! The TCP side: RPC record marking (RFC 5531 §11), one task per
//! connection reading records, calls run concurrently (at most
//! [`CALLS_PER_CONNECTION_MAX`] at once), replies written as they finish.
//! Credentials are admitted before a call runs ([`admit`]); calls that
//! change the file system pass through the duplicate-request cache
//! (`drc.rs`).

use crate::drc::{self, DuplicateRequestCache, Seen};
use crate::fs::{Auth, Caller, NfsFileSystem};
use crate::rpc::{
    auth_error_reply_message, auth_flavor, auth_stat, auth_unix, call_body, garbage_args_reply_message,
    prog_mismatch_reply_message, prog_unavail_reply_message, rpc_body, rpc_msg, rpc_vers_mismatch,
};
use crate::xdr::XDR;
use crate::{mount, nfs, procs, RECORD_BYTES_MAX};
use std::collections::HashMap;
use std::io::Cursor;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
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
/// Connections one client address may hold open at once unless
/// configured ([`Limits`]): Linux's `nconnect` opens at most 16.
pub const CONNECTIONS_PER_CLIENT_DEFAULT: usize = 16;
/// Longest AUTH_SYS credential body (RFC 5531: 400 bytes).
const AUTH_BODY_MAX: usize = 400;
/// Most supplementary groups an AUTH_SYS credential names (RFC 5531).
const AUTH_SYS_GROUPS_MAX: usize = 16;

/// The limits an operator may set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections one client address may hold open at once (1 to
    /// [`CONNECTIONS_MAX`]); more are closed at accept, so one host cannot
    /// take every connection.
    pub connections_per_client: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { connections_per_client: CONNECTIONS_PER_CLIENT_DEFAULT }
    }
}

/// Open connections per client address; an address leaves the map with
/// its last connection, so it holds at most [`CONNECTIONS_MAX`] addresses.
#[derive(Default)]
struct PerClient(Mutex<HashMap<IpAddr, usize>>);

/// One connection counted against its client's limit until dropped.
struct ClientSlot {
    counts: Arc<PerClient>,
    ip: IpAddr,
}

impl ClientSlot {
    /// A slot for `ip`, or `None` if it holds `max` connections already.
    fn take(counts: &Arc<PerClient>, ip: IpAddr, max: usize) -> Option<ClientSlot> {
        let mut map = counts.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(ClientSlot { counts: counts.clone(), ip })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut map = self.counts.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// Whether a peer may talk to the server at all (its allowed networks).
pub trait PeerFilter: Send + Sync + 'static {
    /// `true` if `peer` is served.
    fn allows(&self, peer: &SocketAddr) -> bool;
}

/// Serves NFSv3 and MOUNT v3 on `listener` for `fs` until `shutdown`
/// completes; connections from peers `filter` refuses, or over `limits`,
/// are closed at once; resent calls are answered from `drc`.
///
/// # Errors
/// Accepting a connection failed, or `limits` are out of range.
pub async fn serve(
    listener: TcpListener,
    fs: Arc<dyn NfsFileSystem>,
    filter: Arc<dyn PeerFilter>,
    (limits, drc): (Limits, DuplicateRequestCache),
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    if !(1..=CONNECTIONS_MAX).contains(&limits.connections_per_client) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("connections per client must be 1 to {CONNECTIONS_MAX}"),
        ));
    }
    let per_client = Arc::new(PerClient::default());
    let drc = Arc::new(drc);
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
        let Some(slot) = ClientSlot::take(&per_client, peer.ip().to_canonical(), limits.connections_per_client) else {
            let max = limits.connections_per_client;
            tracing::warn!(%peer, "refusing an NFS connection: this client holds {max} (connections per client)");
            continue;
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "refusing an NFS connection: {CONNECTIONS_MAX} are open");
            continue;
        };
        let (fs, in_flight, drc) = (fs.clone(), in_flight.clone(), drc.clone());
        tokio::spawn(async move {
            if let Err(e) = connection(stream, peer, fs, in_flight, drc).await {
                tracing::debug!(%peer, error = %e, "NFS connection ended");
            }
            drop((permit, slot));
        });
    }
}

/// Reads records from one connection and answers each.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    fs: Arc<dyn NfsFileSystem>,
    in_flight: Arc<tokio::sync::Semaphore>,
    drc: Arc<drc::Cache>,
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
        let (fs, tx, drc) = (fs.clone(), tx.clone(), drc.clone());
        tokio::spawn(async move {
            if let Some(reply) = answer(&record, peer, fs.as_ref(), &drc).await {
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
/// (nothing to answer), or a resent call whose first run gave no reply.
async fn answer(record: &[u8], peer: SocketAddr, fs: &dyn NfsFileSystem, drc: &drc::Cache) -> Option<Vec<u8>> {
    let mut input = Cursor::new(record);
    let mut msg = rpc_msg::default();
    if let Err(e) = msg.deserialize(&mut input) {
        tracing::debug!(%peer, error = %e, "dropping an RPC record that does not decode");
        return None;
    }
    let xid = msg.xid;
    let rpc_body::CALL(call) = msg.body else { return None };
    let mut output = Vec::new();
    if call.rpcvers != 2 {
        rpc_vers_mismatch(xid).serialize(&mut output).ok()?;
        return Some(output);
    }
    let auth = match admit(&call) {
        Ok(auth) => auth,
        Err(why) => {
            tracing::debug!(%peer, xid, flavor = call.cred.flavor, ?why, "refusing a call's credentials");
            auth_error_reply_message(xid, why).serialize(&mut output).ok()?;
            return Some(output);
        }
    };
    let args = &record[input.position() as usize..];
    let ticket = if drc::Cache::keeps(&call) {
        match drc.begin(peer.ip().to_canonical(), xid, drc::Cache::digest(&call, &auth, args)) {
            Seen::New(ticket) => Some(ticket),
            Seen::Again(first) => {
                tracing::debug!(%peer, xid, proc = call.proc, "a resent call answered from the duplicate-request cache");
                return drc::replay(first).await;
            }
        }
    } else {
        None
    };
    let caller = Caller { peer, auth };
    let started = std::time::Instant::now();
    let proc = if call.prog == nfs::PROGRAM { crate::proc_name(call.proc) } else { "mount" };
    let result =
        fs.operation(proc, &caller, Box::pin(dispatch(xid, &call, &caller, &mut input, &mut output, fs))).await;
    let garbage = result.is_err();
    if let Err(e) = result {
        tracing::debug!(%peer, xid, error = %e, "an RPC call's arguments do not decode");
        output.clear();
        garbage_args_reply_message(xid).serialize(&mut output).ok()?;
    }
    if call.prog == nfs::PROGRAM && call.vers == nfs::VERSION {
        let outcome = if garbage { "garbage_args" } else { crate::outcome_of(call.proc, &output) };
        fs.answered(crate::proc_name(call.proc), outcome, started.elapsed());
    }
    if let Some(ticket) = ticket {
        ticket.done(&output);
    }
    Some(output)
}

/// The call's credentials, or why they are refused (RFC 5531 §9):
/// - `AUTH_SYS`: its uid, gid and groups; `AUTH_BADCRED` if the body is
///   over 400 bytes, does not decode or names more than 16 groups;
/// - `AUTH_NONE`: only for the NULL procedures and MOUNT's calls that
///   change nothing and read no file (DUMP, UMNT, UMNTALL, EXPORT) —
///   anything else is `AUTH_TOOWEAK` (a correct credential, too weak to
///   decide a file request by);
/// - every other flavour (`AUTH_SHORT`, `AUTH_DH`, `RPCSEC_GSS`,
///   `AUTH_TLS`, unknown numbers): `AUTH_BADCRED`, the server cannot check
///   such a credential (Linux's answer to a flavour it has no handler for).
fn admit(call: &call_body) -> Result<Auth, auth_stat> {
    const AUTH_NULL: u32 = auth_flavor::AUTH_NULL as u32;
    const AUTH_UNIX: u32 = auth_flavor::AUTH_UNIX as u32;
    match call.cred.flavor {
        AUTH_UNIX => {
            if call.cred.body.len() > AUTH_BODY_MAX {
                return Err(auth_stat::AUTH_BADCRED);
            }
            let mut unix = auth_unix::default();
            unix.deserialize(&mut Cursor::new(&call.cred.body)).map_err(|_| auth_stat::AUTH_BADCRED)?;
            if unix.gids.len() > AUTH_SYS_GROUPS_MAX {
                return Err(auth_stat::AUTH_BADCRED);
            }
            Ok(Auth::Sys { uid: unix.uid, gid: unix.gid, groups: unix.gids })
        }
        AUTH_NULL if call.proc == 0 || (call.prog == mount::PROGRAM && call.proc != 1) => Ok(Auth::None),
        AUTH_NULL => Err(auth_stat::AUTH_TOOWEAK),
        _ => Err(auth_stat::AUTH_BADCRED),
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
    fn a_client_address_holds_at_most_its_slots_and_leaves_the_map_with_its_last() {
        let counts = Arc::new(PerClient::default());
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = ClientSlot::take(&counts, a, 2).expect("a first slot");
        let second = ClientSlot::take(&counts, a, 2).expect("a second slot");
        assert!(ClientSlot::take(&counts, a, 2).is_none(), "a third slot for one address");
        let other = ClientSlot::take(&counts, b, 2).expect("another address is counted apart");
        drop(first);
        let again = ClientSlot::take(&counts, a, 2).expect("a slot once one went");
        drop((second, again, other));
        assert!(counts.0.lock().unwrap().is_empty(), "addresses without connections are forgotten");
    }

    #[test]
    fn credentials_other_than_auth_sys_are_refused_with_the_documented_reply() {
        use crate::rpc::opaque_auth;
        let call = |flavor: u32, prog: u32, proc: u32| call_body {
            rpcvers: 2,
            prog,
            vers: 3,
            proc,
            cred: opaque_auth { flavor, body: vec![1, 2, 3, 4] },
            verf: opaque_auth::default(),
        };
        for flavor in [2, 3, 6, 7, 8, u32::MAX] {
            for (prog, proc) in [(nfs::PROGRAM, 0), (nfs::PROGRAM, 1), (mount::PROGRAM, 5)] {
                let refused = admit(&call(flavor, prog, proc));
                assert!(matches!(refused, Err(auth_stat::AUTH_BADCRED)), "flavour {flavor}: {refused:?}");
            }
        }
        for (prog, proc) in [(nfs::PROGRAM, 0), (mount::PROGRAM, 0), (mount::PROGRAM, 2), (mount::PROGRAM, 5)] {
            assert!(matches!(admit(&call(0, prog, proc)), Ok(Auth::None)), "AUTH_NONE {prog} {proc}");
        }
        for (prog, proc) in [(nfs::PROGRAM, 1), (nfs::PROGRAM, 12), (mount::PROGRAM, 1)] {
            assert!(matches!(admit(&call(0, prog, proc)), Err(auth_stat::AUTH_TOOWEAK)), "AUTH_NONE {prog} {proc}");
        }
        // PROTOCOL.md's vector: the reply to a RPCSEC_GSS call, xid 0x01020304.
        let mut out = Vec::new();
        auth_error_reply_message(0x0102_0304, auth_stat::AUTH_BADCRED).serialize(&mut out).unwrap();
        let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "0102030400000001000000010000000100000001");
        // An RPC version other than 2: RPC_MISMATCH naming 2 to 2.
        out.clear();
        rpc_vers_mismatch(7).serialize(&mut out).unwrap();
        let words: Vec<u32> = out.chunks(4).map(|c| u32::from_be_bytes(c.try_into().unwrap())).collect();
        assert_eq!(words, [7, 1, 1, 0, 2, 2]);
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
