//! Routing by request class (`nasd_proto::routing`; docs/PROTOCOL.md,
//! "Routing table"): the site every new inode records (`inodes.site`), and
//! the routing table kept in the store.
//!
//! With mkdir switching (`[manager] routing = "mkdir-switching"`, the
//! default) a directory keeps its parent's site unless the top half of
//! `name_hash(parent, name)` is below `p · 2^32` (`[manager]
//! redirect_probability`, by default 1/N for N managers in the table), and
//! then takes `name_hash mod 64` — a function of (parent, name), so racing
//! creators agree; every other inode takes its directory's site. With name
//! hashing every inode made as (parent, name) takes `name_hash mod 64`. The
//! table's policy wins over a manager's configured one.
//!
//! The table is the setting [`ROUTING_SETTING`] (the `RoutingTable`
//! encoding); its version only grows, one at a time
//! ([`Namespace::set_routing`]). Which site a new inode takes follows the
//! table's policy and the redirect probability the manager sets
//! ([`Namespace::set_site_policy`]).

use crate::backend::Backend;
use crate::namespace::Namespace;
use crate::types::Inode;
use nasd_proto::fs::{FileKind, FsStatus, Ino};
use nasd_proto::routing::{name_hash, name_site, RoutingPolicy, RoutingTable};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Settings key of the routing table.
pub const ROUTING_SETTING: &str = "routing";

/// `p · 2^32` for a redirect probability `p` in `[0, 1]` (clamped).
pub fn redirect_scaled(p: f64) -> u64 {
    let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
    (p * (1u64 << 32) as f64).round() as u64
}

/// How new inodes choose their site: the routing policy and, for mkdir
/// switching, the redirect probability (`p · 2^32`).
#[derive(Debug)]
pub(crate) struct SitePolicy {
    name_hashing: AtomicBool,
    redirect: AtomicU64,
}

impl Default for SitePolicy {
    /// Mkdir switching that never redirects: every inode in site 0 (one
    /// manager).
    fn default() -> Self {
        SitePolicy { name_hashing: AtomicBool::new(false), redirect: AtomicU64::new(0) }
    }
}

impl SitePolicy {
    /// The site of a new inode of `kind` made as (`parent`, `name`).
    pub(crate) fn site_for(&self, parent: &Inode, name: &str, kind: FileKind) -> u8 {
        let pino: Ino = parent.attr.ino;
        if self.name_hashing.load(Ordering::Relaxed) {
            return name_site(pino, name);
        }
        if kind != FileKind::Dir {
            return parent.site;
        }
        let h = name_hash(pino, name);
        if (h >> 32) < self.redirect.load(Ordering::Relaxed) {
            name_site(pino, name)
        } else {
            parent.site
        }
    }
}

impl<B: Backend> Namespace<B> {
    /// Sets how new inodes choose their site: `policy`, and for mkdir
    /// switching the probability `redirect_probability` (in `[0, 1]`) that a
    /// new directory leaves its parent's site.
    pub fn set_site_policy(&self, policy: RoutingPolicy, redirect_probability: f64) {
        self.sites.name_hashing.store(policy == RoutingPolicy::NameHashing, Ordering::Relaxed);
        self.sites.redirect.store(redirect_scaled(redirect_probability), Ordering::Relaxed);
    }

    /// The routing table, if one was stored.
    ///
    /// # Errors
    /// `Internal` (a stored table that does not decode, logged).
    pub fn routing(&self) -> Result<Option<RoutingTable>, FsStatus> {
        self.backend.read(|t| stored(t.get_setting(ROUTING_SETTING)?))
    }

    /// Stores `table` as the first routing table unless one exists; the
    /// table stored after the call (managers starting together on a new
    /// database agree on one).
    ///
    /// # Errors
    /// `InvalidArgument` (a table that breaks the encoding's rules, or a
    /// version other than 1); `Internal`.
    pub fn init_routing(&self, table: &RoutingTable) -> Result<RoutingTable, FsStatus> {
        if table.validate().is_err() || table.version != 1 {
            return Err(FsStatus::InvalidArgument);
        }
        self.backend.transact(|t| match stored(t.get_setting(ROUTING_SETTING)?)? {
            Some(found) => Ok(found),
            None => {
                t.put_setting(ROUTING_SETTING, &table.to_bytes())?;
                Ok(table.clone())
            }
        })
    }

    /// Replaces the routing table with `table`, whose version must be the
    /// stored one plus one (1 if none is stored).
    ///
    /// # Errors
    /// `StaleRouting` (another version is next: someone changed the table
    /// first); `InvalidArgument` (a table that breaks the encoding's
    /// rules); `Internal`.
    pub fn set_routing(&self, table: &RoutingTable) -> Result<RoutingTable, FsStatus> {
        if table.validate().is_err() {
            return Err(FsStatus::InvalidArgument);
        }
        self.backend.transact(|t| {
            let now = stored(t.get_setting(ROUTING_SETTING)?)?.map_or(0, |r| r.version);
            if table.version != now + 1 {
                return Err(FsStatus::StaleRouting);
            }
            t.put_setting(ROUTING_SETTING, &table.to_bytes())?;
            Ok(table.clone())
        })
    }
}

fn stored(bytes: Option<Vec<u8>>) -> Result<Option<RoutingTable>, FsStatus> {
    bytes
        .map(|b| {
            RoutingTable::from_bytes(&b).map_err(|e| {
                tracing::error!(error = %e, "the stored routing table does not decode");
                FsStatus::Internal
            })
        })
        .transpose()
}
