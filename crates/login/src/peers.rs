//! Per-host admission for the daemons' TLS sessions: one host may hold only
//! so many sessions at once, so it cannot take every slot (each costs a TLS
//! state and, before login, a login message's buffer).

use nasd_env::{Env, Listener, Stream};
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// Accepts connections on `listener` until `shutdown` turns true and runs
/// `session` for each on a task of its own: at most `sessions_max` at once
/// (more wait to be accepted) and `per_host` from one host (more are closed
/// on accept). A session's slots are given back when its future ends.
/// Session tasks are `env`'s (a simulated crash of the daemon ends them).
pub async fn accept_sessions<F, S>(
    env: &Env,
    listener: Listener,
    sessions_max: usize,
    per_host: usize,
    mut shutdown: watch::Receiver<bool>,
    session: F,
) where
    F: Fn(Stream, SocketAddr) -> S,
    S: Future<Output = ()> + Send + 'static,
{
    let sessions = Arc::new(Semaphore::new(sessions_max));
    let hosts = HostLimit::new(per_host);
    loop {
        let permit = tokio::select! {
            biased;
            p = sessions.clone().acquire_owned() => p.expect("semaphore never closed"),
            _ = shutdown.changed() => return,
        };
        let (socket, peer) = tokio::select! {
            biased;
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let Some(slot) = hosts.admit(peer.ip()) else {
            tracing::debug!(%peer, "this peer's session limit reached; closing");
            continue;
        };
        let _ = socket.set_nodelay(true);
        let served = session(socket, peer);
        env.spawn(async move {
            served.await;
            drop((permit, slot));
        });
    }
}

/// The host an address belongs to: itself for IPv4 (and IPv4-mapped IPv6),
/// its /64 for IPv6 (one host's addresses).
pub fn host_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
        v4 => v4,
    }
}

/// Open sessions per host, at most `per_host` each.
pub struct HostLimit {
    per_host: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One session's place in a [`HostLimit`]; given back when dropped.
pub struct HostSlot {
    limit: Arc<HostLimit>,
    host: IpAddr,
}

impl HostLimit {
    /// A limit of `per_host` sessions per host.
    pub fn new(per_host: usize) -> Arc<Self> {
        Arc::new(HostLimit { per_host, open: Mutex::new(HashMap::new()) })
    }

    /// A slot for one more session from the host of `ip`, unless it holds
    /// `per_host` already.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<HostSlot> {
        let host = host_of(ip);
        let mut open = self.open.lock().expect("host limit lock");
        let n = open.entry(host).or_default();
        if *n >= self.per_host {
            return None;
        }
        *n += 1;
        Some(HostSlot { limit: self.clone(), host })
    }
}

impl Drop for HostSlot {
    fn drop(&mut self) {
        let mut open = self.limit.open.lock().expect("host limit lock");
        if let Some(n) = open.get_mut(&self.host) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.host);
            }
        }
    }
}

/// The request id of a manager- or authentication-server request body that
/// could not be decoded, if it got that far (both begin `opcode u16,
/// request_id u64`), so that the error reply matches the request; else 0.
pub fn request_id_of(body: &[u8]) -> u64 {
    body.get(2..10).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_holds_at_most_its_share_and_gets_slots_back() {
        let limit = HostLimit::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let (s1, s2) = (limit.admit(a).unwrap(), limit.admit(a).unwrap());
        assert!(limit.admit(a).is_none(), "a third session from one host");
        assert!(limit.admit("10.0.0.2".parse().unwrap()).is_some(), "another host is admitted");
        drop(s1);
        assert!(limit.admit(a).is_some(), "a slot given back is free again");
        drop(s2);
    }

    #[test]
    fn ipv6_addresses_of_one_slash_64_are_one_host() {
        let limit = HostLimit::new(1);
        let _s = limit.admit("2001:db8::1".parse().unwrap()).unwrap();
        assert!(limit.admit("2001:db8::ffff:1".parse().unwrap()).is_none());
        assert!(limit.admit("2001:db8:0:1::1".parse().unwrap()).is_some());
        assert_eq!(host_of("::ffff:10.0.0.1".parse().unwrap()), "10.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn request_ids_are_read_from_what_arrived() {
        let mut body = vec![0x01, 0x00];
        body.extend_from_slice(&42u64.to_le_bytes());
        assert_eq!(request_id_of(&body), 42);
        assert_eq!(request_id_of(&body[..9]), 0, "cut short");
    }
}
