//! What the nasd daemons that log users in over TLS share — the file
//! manager and the authentication server: per-host login back-off ([`login_backoff`]) and session
//! limits ([`peers`]), argon2id password hashes computed
//! on a bounded pool of worker threads ([`passwords`]), and the cluster's
//! private certificate authority with the certificates and acceptor they
//! serve with ([`tls`]). Below both daemons; knows neither.
#![deny(missing_docs)]

pub mod auth_client;
pub mod login_backoff;
pub mod passwords;
pub mod peers;
pub mod tls;
