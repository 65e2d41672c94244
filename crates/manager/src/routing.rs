//! Routing by request class (`nasd_proto::routing`; bytes in
//! docs/PROTOCOL.md, "Routing table"): the manager's
//! cache of the routing table in the database, which sessions route by.
//!
//! The table comes only from the database: read at each maintenance pass
//! ([`Manager::refresh_routing`]) and after this manager stores one
//! (`SET_ROUTING`, administrators only). A session that fetched it
//! (`GET_ROUTING`) routes by that version; once the manager holds a newer
//! one, the session's next request naming a handle is refused with
//! `STALE_ROUTING` before anything is done (`Manager::check_routing`).
//!
//! A manager that serves makes the first table if there is none — itself
//! (`[manager] advertise`, else its listening address) holding every site,
//! version 1; on SQLite, where it is the only possible manager, a table
//! naming another address is replaced by one naming it alone.

use crate::service::Session;
use crate::{Failure, Manager};
use nasd_proto::fs::FsStatus;
use nasd_proto::manager::{ManagerReply, ManagerRequest};
use nasd_proto::routing::RoutingTable;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// The routing table this manager holds.
#[derive(Debug, Default)]
pub(crate) struct RoutingState {
    table: RwLock<Option<Arc<RoutingTable>>>,
    /// `table`'s version (0: none yet), read on every request.
    version: AtomicU64,
}

impl Manager {
    /// The routing table this manager holds (as of its last maintenance
    /// pass), if the database has one.
    pub fn routing_table(&self) -> Option<Arc<RoutingTable>> {
        self.routing.table.read().expect("routing lock").clone()
    }

    /// Keeps `table` unless an equal or newer one is held, and sets how new
    /// inodes choose their site from it: its policy, and the redirect
    /// probability configured (default 1/N for N managers).
    fn hold_routing(&self, table: RoutingTable) {
        let mut held = self.routing.table.write().expect("routing lock");
        if held.as_ref().is_some_and(|h| h.version >= table.version) {
            return;
        }
        let p = self.config.redirect_probability.unwrap_or(1.0 / table.managers.len() as f64);
        self.ns.set_site_policy(table.policy, p);
        if self.config.routing != table.policy {
            tracing::warn!(
                configured = self.config.routing.name(),
                table = table.policy.name(),
                "the routing table's policy differs from the configured one: following the table"
            );
        }
        tracing::info!(version = table.version, managers = table.managers.len(), "routing table");
        self.routing.version.store(table.version, Ordering::SeqCst);
        *held = Some(Arc::new(table));
    }

    /// Reads the routing table from the database into the cache (each
    /// maintenance pass).
    pub async fn refresh_routing(&self) -> Result<(), Failure> {
        if let Some(table) = self.meta(|ns| ns.routing()).await? {
            self.hold_routing(table);
        }
        Ok(())
    }

    /// Makes the first routing table — this manager, at `addr`, holding
    /// every site — unless the database has one, and holds what it has. On
    /// SQLite this manager is the only one that can use the database, so a
    /// table naming anything else (an earlier address) is replaced by the
    /// next version naming this manager alone.
    pub async fn init_routing(&self, addr: &str) -> Result<(), Failure> {
        let first = RoutingTable::single(addr, self.config.routing);
        let sole = matches!(self.config.metadata, None | Some(nasd_meta::Location::Sqlite(_)));
        let addr = addr.to_string();
        let table = self
            .meta(move |ns| {
                let found = ns.init_routing(&first)?;
                if !sole || found.managers == [addr.clone()] {
                    return Ok(found);
                }
                let next = RoutingTable { version: found.version + 1, ..RoutingTable::single(&addr, found.policy) };
                ns.set_routing(&next)
            })
            .await?;
        self.hold_routing(table);
        Ok(())
    }

    /// `GET_ROUTING`: the table held (read from the database if none is
    /// yet); the session routes by its version from now on.
    pub async fn get_routing(&self, s: &mut Session) -> Result<ManagerReply, Failure> {
        if self.routing_table().is_none() {
            self.refresh_routing().await?;
        }
        let table = self.routing_table().ok_or_else(|| {
            Failure::new(FsStatus::NotSupported, "this file system has no routing table yet (no manager served)")
        })?;
        s.routing_version = Some(table.version);
        Ok(ManagerReply::Routing((*table).clone()))
    }

    /// `SET_ROUTING`: stores the next version of the table (administrators).
    pub(crate) async fn set_routing(&self, s: &Session, table: RoutingTable) -> Result<ManagerReply, Failure> {
        self.require_admin(s)?;
        let version = table.version;
        let stored = self.meta(move |ns| ns.set_routing(&table)).await.map_err(|f| {
            if f.status == FsStatus::StaleRouting {
                Failure::new(
                    FsStatus::StaleRouting,
                    format!("routing table version {version} is not the next one: fetch the table and try again"),
                )
            } else {
                f
            }
        })?;
        self.hold_routing(stored.clone());
        Ok(ManagerReply::Routing(stored))
    }

    /// Fails with `STALE_ROUTING` if the session routes by an older table
    /// than this manager holds and `req` names a handle (a name-space or
    /// file request, routed by its handle's site).
    pub(crate) fn check_routing(&self, s: &Session, req: &ManagerRequest) -> Result<(), Failure> {
        let Some(v) = s.routing_version else { return Ok(()) };
        let now = self.routing.version.load(Ordering::SeqCst);
        if v < now && !req.handles().is_empty() {
            return Err(Failure::new(
                FsStatus::StaleRouting,
                format!("the session routes by routing table version {v}; this manager holds {now}: fetch it again"),
            ));
        }
        Ok(())
    }
}
