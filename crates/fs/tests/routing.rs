//! Routing by request class (docs/ARCHITECTURE.md, "Routing by request
//! class"): managers on one real PostgreSQL server (the test starts it),
//! four real drives, `nasd_fs` clients over TLS.
//!
//! - `mkdir_switching_spreads_directories_over_both_managers`: with two
//!   managers in the table, directories made under the root land in sites
//!   of both managers, the files in them take their directory's site, and
//!   the client's requests reach both managers.
//! - `name_hashing_spreads_names_over_both_managers`: the same under name
//!   hashing, where every (parent, name) picks its own site.
//! - `adding_a_manager_while_a_client_works_refreshes_its_table`: a third
//!   manager is added while a client creates and writes files: the client
//!   is refused with `STALE_ROUTING`, fetches the table, resends, reaches
//!   the new manager, and every file is there with its bytes.
//! - `a_dead_managers_sites_go_to_another`: one of two managers stops; the
//!   client's requests for its sites go to the other, and nothing fails.

mod common;

use common::*;
use nasd_fs::{FsClient, FsConfig, FsStatus, OpenMode};
use nasd_fs::{RoutingPolicy, RoutingTable};
use nasd_manager::{Location, ManagerConfig};
use nasd_meta::testing::PgServer;
use nasd_proto::manager::{ManagerReply, ManagerRequest};
use nasd_proto::routing::name_site;
use std::collections::BTreeSet;
use std::time::Duration;

/// Directories each scenario makes.
const DIRS: usize = 24;
/// Files per directory.
const FILES_PER_DIR: usize = 3;

fn config(url: &str, routing: RoutingPolicy) -> ManagerConfig {
    ManagerConfig {
        pool_target: 8,
        maintenance_interval: Duration::from_millis(200),
        metadata: Some(url.parse::<Location>().expect("a PostgreSQL URL")),
        routing,
        ..ManagerConfig::default()
    }
}

#[test]
fn mkdir_switching_spreads_directories_over_both_managers() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    run(spread(server.fresh_url(), RoutingPolicy::MkdirSwitching));
    drop(server);
}

#[test]
fn name_hashing_spreads_names_over_both_managers() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    run(spread(server.fresh_url(), RoutingPolicy::NameHashing));
    drop(server);
}

#[test]
fn adding_a_manager_while_a_client_works_refreshes_its_table() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    run(add_while_working(server.fresh_url()));
    drop(server);
}

#[test]
fn a_dead_managers_sites_go_to_another() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    run(dead_manager(server.fresh_url()));
    drop(server);
}

/// Stores the next routing table through `admin` (`SET_ROUTING`).
async fn set_routing(admin: &FsClient, table: RoutingTable) -> RoutingTable {
    match to(admin.call(&ManagerRequest::SetRouting { table })).await.expect("SET_ROUTING") {
        ManagerReply::Routing(t) => t,
        other => panic!("unexpected SET_ROUTING reply {other:?}"),
    }
}

async fn get_routing(fs: &FsClient) -> RoutingTable {
    match to(fs.call(&ManagerRequest::GetRouting)).await.expect("GET_ROUTING") {
        ManagerReply::Routing(t) => t,
        other => panic!("unexpected GET_ROUTING reply {other:?}"),
    }
}

/// Makes `DIRS` directories under `/w` (named `{prefix}{i}`) with
/// `FILES_PER_DIR` small files each; the directories' sites.
async fn make_tree(fs: &FsClient, prefix: &str) -> Vec<u8> {
    let mut sites = Vec::new();
    for i in 0..DIRS {
        let dir = format!("/w/{prefix}{i}");
        to(fs.mkdir(&dir, 0o755)).await.unwrap_or_else(|e| panic!("mkdir {dir}: {e}"));
        let d = to(fs.walk(&dir, OpenMode::None)).await.expect("walk").handle();
        sites.push(d.site);
        for j in 0..FILES_PER_DIR {
            let path = format!("{dir}/f{j}");
            to(fs.write_file(&path, &pattern((i * 10 + j) as u64, 100 + j)))
                .await
                .unwrap_or_else(|e| panic!("write {path}: {e}"));
            let f = to(fs.walk(&path, OpenMode::None)).await.expect("walk").handle();
            if fs.routing_table().is_some_and(|t| t.policy == RoutingPolicy::MkdirSwitching) {
                assert_eq!(f.site, d.site, "{path} takes its directory's site");
            } else {
                assert_eq!(f.site, name_site(d.ino, &format!("f{j}")), "{path} takes its name's site");
            }
        }
    }
    sites
}

async fn check_tree(fs: &FsClient, prefix: &str) {
    for i in 0..DIRS {
        for j in 0..FILES_PER_DIR {
            let path = format!("/w/{prefix}{i}/f{j}");
            let back = to(fs.read_file(&path)).await.unwrap_or_else(|e| panic!("read {path}: {e}"));
            assert!(back == pattern((i * 10 + j) as u64, 100 + j), "{path} reads back");
        }
    }
}

/// Requests the client sent to `addr`.
fn sent_to(fs: &FsClient, addr: &str) -> u64 {
    fs.routing_stats().sent.iter().find(|(a, _)| a == addr).map_or(0, |(_, n)| *n)
}

async fn spread(url: String, policy: RoutingPolicy) {
    let c =
        Cluster::start(ClusterOptions { config: config(&url, policy), maintenance: true, ..Default::default() }).await;
    let m2 = c.start_other_manager("manager-2", config(&url, policy), true).await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    let first = get_routing(&admin).await;
    assert_eq!((first.version, first.policy, &first.managers), (1, policy, &vec![c.addr.to_string()]));
    let two = set_routing(&admin, first.with_manager(&m2.addr.to_string()).unwrap()).await;
    assert_eq!(two.holdings(), vec![32, 32]);
    // The other manager learns the table at its next maintenance pass.
    while m2.manager.routing_table().is_none_or(|t| t.version < 2) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    to(admin.mkdir("/w", 0o777)).await.expect("mkdir /w");

    let fs = c.login(USER_A, PW_A).await;
    assert_eq!(fs.routing_table().map(|t| t.version), Some(2), "fetched at login");
    let sites = make_tree(&fs, "d").await;
    check_tree(&fs, "d").await;
    let holders: BTreeSet<&str> = sites.iter().map(|s| two.manager_of(*s)).collect();
    assert_eq!(holders.len(), 2, "{policy:?}: directories in sites of both managers: {sites:?}");
    let distinct: BTreeSet<u8> = sites.iter().copied().collect();
    assert!(distinct.len() > DIRS / 3, "{policy:?}: directories spread over sites: {sites:?}");
    let (a, b) = (sent_to(&fs, &c.addr.to_string()), sent_to(&fs, &m2.addr.to_string()));
    assert!(a > 0 && b > 0, "{policy:?}: requests reach both managers: {:?}", fs.routing_stats());
    assert_eq!(fs.routing_stats().stale, 0, "no table changed");
    m2.stop().await;
    c.stop().await;
}

async fn add_while_working(url: String) {
    let policy = RoutingPolicy::MkdirSwitching;
    let c =
        Cluster::start(ClusterOptions { config: config(&url, policy), maintenance: true, ..Default::default() }).await;
    let m2 = c.start_other_manager("manager-2", config(&url, policy), true).await;
    let m3 = c.start_other_manager("manager-3", config(&url, policy), true).await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    let first = get_routing(&admin).await;
    let two = set_routing(&admin, first.with_manager(&m2.addr.to_string()).unwrap()).await;
    while m2.manager.routing_table().is_none_or(|t| t.version < 2) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    to(admin.mkdir("/w", 0o777)).await.expect("mkdir /w");
    let fs = c.login(USER_A, PW_A).await;
    assert_eq!(fs.routing_table().map(|t| t.version), Some(2));

    // The client works: a tree before the change, one after.
    make_tree(&fs, "before").await;
    assert_eq!(fs.routing_stats().stale, 0);
    assert_eq!(sent_to(&fs, &m3.addr.to_string()), 0, "the third manager is in no table yet");
    let three = set_routing(&admin, two.with_manager(&m3.addr.to_string()).unwrap()).await;
    assert_eq!(three.version, 3);
    assert_eq!(three.holdings()[2], 21, "floor(64/3) sites moved to the newcomer");
    make_tree(&fs, "after").await;

    let stats = fs.routing_stats();
    assert_eq!(stats.version, 3, "the client routes by the new table: {stats:?}");
    // Once per session that held the old table: at most one per connection it had open.
    assert!(stats.stale >= 1, "the client was refused as stale: {stats:?}");
    assert!(stats.stale <= 3 * nasd_fs::MANAGER_CONNECTIONS_MAX as u64, "once per session at most: {stats:?}");
    assert!(sent_to(&fs, &m3.addr.to_string()) > 0, "the new manager takes requests: {stats:?}");
    // Nothing lost: every file of both trees, read through a fresh client of the newest manager.
    let other = c.login_at(m3.addr, USER_A, PW_A).await;
    check_tree(&other, "before").await;
    check_tree(&other, "after").await;
    let names: BTreeSet<String> = to(other.readdir("/w")).await.expect("readdir").into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 2 * DIRS);

    // A table that is not the next version is refused, and so is one from a non-administrator.
    let e = to(admin.call(&ManagerRequest::SetRouting { table: two.clone() })).await.unwrap_err();
    assert_eq!(e.status(), Some(FsStatus::StaleRouting), "{e}");
    let e = to(fs.call(&ManagerRequest::SetRouting { table: three.without_manager(&m3.addr.to_string()).unwrap() }))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(FsStatus::NotAdmin), "{e}");
    m3.stop().await;
    m2.stop().await;
    c.stop().await;
}

async fn dead_manager(url: String) {
    let policy = RoutingPolicy::MkdirSwitching;
    let c =
        Cluster::start(ClusterOptions { config: config(&url, policy), maintenance: true, ..Default::default() }).await;
    let m2 = c.start_other_manager("manager-2", config(&url, policy), true).await;
    let m2_addr = m2.addr.to_string();
    let admin = c.login(ADMIN, ADMIN_PW).await;
    let first = get_routing(&admin).await;
    set_routing(&admin, first.with_manager(&m2_addr).unwrap()).await;
    while m2.manager.routing_table().is_none_or(|t| t.version < 2) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    to(admin.mkdir("/w", 0o777)).await.expect("mkdir /w");
    let config = FsConfig { failover: vec![m2_addr.clone()], ..c.fs_config(USER_A, PW_A) };
    let fs = to(FsClient::connect(&config)).await.expect("log in");
    make_tree(&fs, "before").await;
    assert!(sent_to(&fs, &m2_addr) > 0, "the second manager served its sites");

    // The second manager goes away: its sites' requests go to the first.
    m2.stop().await;
    make_tree(&fs, "after").await;
    check_tree(&fs, "before").await;
    check_tree(&fs, "after").await;
    let stats = fs.routing_stats();
    assert!(stats.rerouted >= 1, "requests for the dead manager's sites went elsewhere: {stats:?}");
    assert_eq!(fs.current_manager(), c.addr.to_string());
    c.stop().await;
}
