//! The manager on PostgreSQL (`[manager] metadata = "postgres://…"`): four
//! real drives, the manager over TLS, `nasd_fs` clients, and a real
//! PostgreSQL server the test starts itself. A tree is made, written
//! (single-object and Reed-Solomon files), read back byte for byte, linked,
//! renamed (across directories, over existing files and directories) and
//! removed, and the drives keep no object of a removed file; the name space
//! the clients saw is the one in the PostgreSQL database, and no SQLite
//! file was made.

mod common;

use common::*;
use nasd_fs::{FileKind, FsStatus};
use nasd_manager::{Location, ManagerConfig};
use nasd_meta::testing::{check_invariants, tree, PgServer};
use nasd_meta::{Backend, Layout, Namespace, Postgres};
use nasd_proto::manager::{ManagerReply, ManagerRequest, OpenMode};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MIB: usize = 1024 * 1024;

/// A PostgreSQL test server with a fresh database: the server, the
/// database's URL and its name.
fn fresh_database() -> (PgServer, String, String) {
    let server = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let url = server.fresh_url();
    let db = url.rsplit('/').next().unwrap().to_string();
    (server, url, db)
}

#[test]
fn files_round_trip_with_the_metadata_on_postgres() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let url = server.fresh_url();
    run(scenario(url));
    drop(server);
}

async fn scenario(url: String) {
    let config = ManagerConfig {
        pool_target: 8,
        metadata: Some(url.parse::<Location>().expect("a PostgreSQL URL")),
        ..ManagerConfig::default()
    };
    let rs = Layout::parse("rs:2+1@64K").unwrap();
    let c = Cluster::start(ClusterOptions { config, root_layout: Some(rs), ..Default::default() }).await;
    assert!(!c.dir().join("manager").join(nasd_manager::META_DB).exists(), "no SQLite file beside PostgreSQL");
    let admin = c.login(ADMIN, ADMIN_PW).await;
    to(admin.mkdir("/alice", 0o755)).await.expect("mkdir");
    to(admin.chown("/alice", Some(UID_A), Some(UID_A))).await.expect("chown");
    let a = c.login(USER_A, PW_A).await;

    // --- create and write: small and large, single-object and striped with parity
    to(a.mkdir_all("/alice/d1/d2", 0o755)).await.expect("mkdir -p");
    to(admin.set_layout("/alice/d1", Some(Layout::SINGLE))).await.expect("a single-object subtree");
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("/alice/empty", Vec::new()),
        ("/alice/rs", pattern(1, 3 * MIB + 4321)),
        ("/alice/d1/one", pattern(2, 70_000)),
        ("/alice/d1/d2/victim", pattern(3, 777)),
    ];
    for (path, data) in &files {
        to(a.write_file(path, data)).await.unwrap_or_else(|e| panic!("write {path}: {e}"));
    }
    assert_eq!(fs_status(to(a.mkdir("/alice/d1", 0o755)).await), FsStatus::Exists);
    let mut objects = BTreeSet::new();
    for (path, data) in &files {
        assert!(to(a.read_file(path)).await.unwrap() == *data, "{path} reads back");
        let st = to(a.stat(path)).await.unwrap();
        assert_eq!(st.attr.size, data.len() as u64, "{path}");
        let e = to(a.walk(path, nasd_fs::OpenMode::Read)).await.unwrap();
        let access = e.access.expect("a read capability");
        let want = if path.starts_with("/alice/d1") { 1 } else { 3 };
        assert_eq!(access.components.len(), want, "{path}: the layout it inherited");
        objects.extend(access.components.iter().map(|comp| comp.object));
    }
    let hard = to(a.link("/alice/rs", "/alice/d1/rs-hard")).await.expect("hard link");
    assert_eq!(hard.nlink, 2);
    to(a.symlink("d1/one", "/alice/one-link")).await.expect("symlink");
    assert!(to(a.read_file("/alice/one-link")).await.unwrap() == files[2].1);

    // --- rename: across directories, over an existing file, a directory over an empty one
    to(a.rename("/alice/d1/one", "/alice/d1/d2/one")).await.expect("rename across directories");
    assert_eq!(fs_status(to(a.stat("/alice/one-link")).await), FsStatus::NotFound, "the link dangles");
    to(a.rename("/alice/d1/d2/one", "/alice/d1/d2/victim")).await.expect("rename over a file");
    assert!(to(a.read_file("/alice/d1/d2/victim")).await.unwrap() == files[2].1);
    to(a.mkdir("/alice/target", 0o755)).await.unwrap();
    to(a.rename("/alice/d1/d2", "/alice/target")).await.expect("rename a directory over an empty one");
    assert!(to(a.read_file("/alice/target/victim")).await.unwrap() == files[2].1);
    let names: Vec<String> = to(a.readdir("/alice")).await.unwrap().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["d1", "empty", "one-link", "rs", "target"]);

    // --- what the clients saw is what the PostgreSQL database holds
    {
        let ns = Namespace::new(Postgres::open(&url).expect("open the manager's database"), Layout::SINGLE).unwrap();
        check_invariants(&ns);
        let paths: Vec<(String, FileKind)> =
            ns.backend().read(tree).unwrap().into_iter().map(|(p, n)| (p, n.attr.kind)).collect();
        let expect = [
            ("/", FileKind::Dir),
            ("/alice", FileKind::Dir),
            ("/alice/d1", FileKind::Dir),
            ("/alice/d1/rs-hard", FileKind::File),
            ("/alice/empty", FileKind::File),
            ("/alice/one-link", FileKind::Symlink),
            ("/alice/rs", FileKind::File),
            ("/alice/target", FileKind::Dir),
            ("/alice/target/victim", FileKind::File),
        ];
        let mut paths = paths;
        paths.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(paths, expect.map(|(p, k)| (p.to_string(), k)));
    }

    // --- remove everything; no object is left behind
    for p in ["/alice/d1/rs-hard", "/alice/empty", "/alice/one-link", "/alice/rs", "/alice/target/victim"] {
        to(a.unlink(p)).await.unwrap_or_else(|e| panic!("unlink {p}: {e}"));
    }
    for d in ["/alice/d1", "/alice/target"] {
        to(a.rmdir(d)).await.unwrap_or_else(|e| panic!("rmdir {d}: {e}"));
    }
    to(admin.rmdir("/alice")).await.unwrap();
    let (inodes, file_bytes, _) = to(admin.statfs()).await.expect("statfs");
    assert_eq!((inodes, file_bytes), (1, 0), "only the root directory is left");
    to(c.manager.maintain()).await;
    for d in c.manager.drives() {
        let left: BTreeSet<u64> = to(d.list_objects()).await.expect("list objects").into_iter().collect();
        for o in objects.iter().filter(|o| o.drive == d.drive) {
            assert!(!left.contains(&o.object), "object {o:?} of a removed file is still on its drive");
        }
    }
    drop((a, admin));
    c.stop().await;
}

/// The manager's refusal status of a failed call.
#[track_caller]
fn fs_status<T: std::fmt::Debug>(r: Result<T, nasd_fs::FsError>) -> FsStatus {
    match r {
        Err(e) => e.status().unwrap_or_else(|| panic!("expected a refusal from the manager, got {e:?}")),
        Ok(v) => panic!("expected a refusal from the manager, got {v:?}"),
    }
}

/// `sql` in database `db` of `server`, from a thread of its own (the
/// helper runs its own runtime, which an async test's cannot hold).
fn sql(server: &PgServer, db: &str, sql: &str) -> Result<(), String> {
    std::thread::scope(|s| s.spawn(|| server.execute(db, sql)).join().expect("the SQL thread"))
}

/// A cluster whose manager keeps its metadata at `url` (every file on the
/// drives), and its administrator, with `/d` made.
async fn writer_on(url: &str) -> (Cluster, nasd_fs::FsClient) {
    let config = ManagerConfig {
        pool_target: 8,
        small_file_threshold: 0,
        metadata: Some(url.parse::<Location>().expect("a PostgreSQL URL")),
        ..ManagerConfig::default()
    };
    let c = Cluster::start(ClusterOptions { config, ..Default::default() }).await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    to(admin.mkdir("/d", 0o755)).await.expect("mkdir");
    (c, admin)
}

/// The connection to PostgreSQL dies right after a write's commit, at the
/// step that forgets its write intent (a trigger ends its own server
/// process at the first `DELETE` from `intents`, once): the commit stands,
/// so the write is acknowledged and reads back — before the fix the writer
/// was told the request failed "part-way" and took its acknowledged-to-be
/// writes for lost (found by `nasd-cli`'s `netns_cluster`, a put in flight
/// as PostgreSQL was killed). The intent left behind is forgotten by the
/// next maintenance pass.
#[test]
fn a_commit_stands_when_the_database_goes_away_before_its_intent_is_forgotten() {
    let (server, url, db) = fresh_database();
    run(async move {
        let (c, admin) = writer_on(&url).await;
        sql(
            &server,
            &db,
            "CREATE SEQUENCE shot;
             CREATE FUNCTION end_connection() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF nextval('shot') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
               RETURN OLD;
             END $$;
             CREATE TRIGGER end_connection BEFORE DELETE ON intents FOR EACH ROW EXECUTE FUNCTION end_connection();",
        )
        .expect("the trigger");
        let data = pattern(31, 300_000);
        to(admin.write_file("/d/f", &data)).await.expect("the write is committed and acknowledged");
        sql(
            &server,
            &db,
            "DO $$ BEGIN IF NOT (SELECT is_called FROM shot) THEN RAISE EXCEPTION 'no DELETE'; END IF; END $$",
        )
        .expect("the connection was ended at the intent's DELETE");
        assert!(to(admin.read_file("/d/f")).await.expect("read") == data, "the acknowledged bytes");
        sql(
            &server,
            &db,
            "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM intents) THEN RAISE EXCEPTION 'none'; END IF; END $$",
        )
        .expect("the committed intent is left behind");
        c.manager.maintain().await;
        sql(&server, &db, "DO $$ BEGIN IF EXISTS (SELECT 1 FROM intents) THEN RAISE EXCEPTION 'left'; END IF; END $$")
            .expect("maintenance forgot the committed intent");
        drop(server);
    });
}

/// The connection to PostgreSQL dies as a write's `COMMIT` is processed (a
/// deferred trigger, run at commit time, ends its own server process, once):
/// the metadata backend asks the server whether the transaction committed
/// (nasd-meta's `commit_outcome`); it did not, so the writer is told
/// `METADATA_UNAVAILABLE` and sends the commit again. (Were the server to
/// stay away past `COMMIT_OUTCOME_WAIT`, the manager would read the write
/// intent instead — `resolve_commit` — which this test does not reach.) The
/// write is acknowledged once and reads back; before, the writer was told
/// the store failed and rolled its writes back (found by `nasd-cli`'s
/// `netns_cluster`: a put whose commit was in flight as PostgreSQL was
/// killed).
#[test]
fn a_commit_cut_off_at_the_database_is_resolved_and_acknowledged_once() {
    let (server, url, db) = fresh_database();
    run(async move {
        let (_cluster, admin) = writer_on(&url).await;
        sql(
            &server,
            &db,
            "CREATE SEQUENCE shot;
             CREATE FUNCTION end_connection() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF nextval('shot') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
               RETURN NULL;
             END $$;
             CREATE CONSTRAINT TRIGGER end_connection AFTER UPDATE ON intents DEFERRABLE INITIALLY DEFERRED
               FOR EACH ROW EXECUTE FUNCTION end_connection();",
        )
        .expect("the trigger");
        let data = pattern(37, 300_000);
        to(admin.write_file("/d/f", &data)).await.expect("the write is committed and acknowledged");
        sql(
            &server,
            &db,
            "DO $$ BEGIN IF NOT (SELECT is_called FROM shot) THEN RAISE EXCEPTION 'no COMMIT'; END IF; END $$",
        )
        .expect("the connection was ended at the commit");
        assert!(to(admin.read_file("/d/f")).await.expect("read") == data, "the acknowledged bytes");
        assert_eq!(to(admin.stat("/d/f")).await.expect("stat").attr.size, data.len() as u64);
        drop(server);
    });
}

/// The administrator logged in to `c` with a client that records what it is
/// told when it starts to wait out a database outage ([`FsConfig::on_wait`]).
async fn told_admin(c: &Cluster) -> (nasd_fs::FsClient, Arc<Mutex<Vec<String>>>) {
    let told = Arc::new(Mutex::new(Vec::new()));
    let tell = told.clone();
    let config = nasd_fs::FsConfig {
        on_wait: Some(Arc::new(move |m: &str| tell.lock().unwrap().push(m.to_string()))),
        ..c.fs_config(ADMIN, ADMIN_PW)
    };
    (to(nasd_fs::FsClient::connect(&config)).await.expect("log in"), told)
}

/// A trigger on `table` in database `db` that, the first time `when` holds
/// for a row `event` (`INSERT`, `UPDATE`) touches, ends its own server
/// process: the manager's connection dies in that transaction, before its
/// commit (`DELETE` too).
fn end_connection_once(server: &PgServer, db: &str, event: &str, table: &str, when: &str) {
    sql(
        server,
        db,
        &format!(
            "CREATE SEQUENCE shot;
             CREATE FUNCTION end_connection() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF nextval('shot') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
               IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER end_connection BEFORE {event} ON {table} FOR EACH ROW
               WHEN ({when}) EXECUTE FUNCTION end_connection();"
        ),
    )
    .expect("the trigger");
}

/// Fails unless the trigger of [`end_connection_once`] fired.
fn connection_was_ended(server: &PgServer, db: &str) {
    sql(server, db, "DO $$ BEGIN IF NOT (SELECT is_called FROM shot) THEN RAISE EXCEPTION 'not fired'; END IF; END $$")
        .expect("the connection was ended");
}

/// A `CREATE` of a new file whose transaction loses its connection to
/// PostgreSQL: the client is told `METADATA_UNAVAILABLE` in the manager's
/// words, naming the database (and waits it out, so the write goes
/// through). Before, the outage inside the placing transaction came back
/// as the bare status, whose text names no database (found by
/// `netns_cluster`: a put waiting out the outage did not say which
/// database).
#[test]
fn a_create_cut_off_at_the_database_says_which_database() {
    let (server, url, db) = fresh_database();
    run(async move {
        let (cluster, _) = writer_on(&url).await;
        let (admin, told) = told_admin(&cluster).await;
        end_connection_once(&server, &db, "INSERT", "dirents", "true");
        let data = pattern(47, 100_000);
        to(admin.write_file("/d/new", &data)).await.expect("the write waits the outage out");
        connection_was_ended(&server, &db);
        let told = told.lock().unwrap().clone();
        assert_eq!(told.len(), 1, "told once: {told:?}");
        assert!(told[0].contains(&db) && told[0].contains("nothing was changed"), "{told:?}");
        assert!(to(admin.read_file("/d/new")).await.expect("read") == data, "the acknowledged bytes");
        drop(server);
    });
}

/// A request that commits more than once: a truncating `CREATE` of an
/// existing file commits the truncation (under a write transaction of the
/// manager's own) and then the create. The connection to PostgreSQL dies in
/// the create's transaction (at the update of the file's row that keeps
/// its size 0), after the truncation committed: the manager waits the
/// outage out and finishes the request, and the client is told of no
/// outage. Before, the client was told `METADATA_UNAVAILABLE`, "nothing was
/// changed", when the truncation was.
#[test]
fn a_truncating_create_cut_off_after_its_truncation_committed_is_finished() {
    let (server, url, db) = fresh_database();
    run(async move {
        let (cluster, _) = writer_on(&url).await;
        let (admin, told) = told_admin(&cluster).await;
        to(admin.write_file("/d/f", &pattern(41, 300_000))).await.expect("the first write");
        let ino = to(admin.stat("/d/f")).await.expect("stat").attr.ino;
        let when = format!("OLD.ino = {ino} AND OLD.size = 0 AND NEW.size = 0");
        end_connection_once(&server, &db, "UPDATE", "inodes", &when);
        let data = pattern(43, 200_000);
        to(admin.write_file("/d/f", &data)).await.expect("the overwrite is finished and acknowledged");
        connection_was_ended(&server, &db);
        assert_eq!(*told.lock().unwrap(), Vec::<String>::new(), "the manager waited the outage out");
        assert!(to(admin.read_file("/d/f")).await.expect("read") == data, "the acknowledged bytes");
        drop(server);
    });
}

/// A `COMMIT` sent again after it committed — its answer lost, as when the
/// connection to PostgreSQL died as the manager forgot the transaction's
/// write intent (left Committed) — is answered as done, with the file as
/// committed, and the intent is forgotten then; sent a third time, the
/// transaction is no longer open (`ABORTED`). The writes are committed
/// once either way (`commit_write`'s `committed_before`).
#[test]
fn a_commit_sent_again_after_it_committed_is_answered_as_done() {
    let (server, url, db) = fresh_database();
    run(async move {
        let (c, admin) = writer_on(&url).await;
        let data = pattern(53, 100_000);
        to(admin.write_file("/d/f", &data)).await.expect("write");
        let (m, len) = (c.manager.clone(), data.len() as u64);
        let s = to(m.open_session(ADMIN, ADMIN_PW)).await.expect("a session");
        let walk = ManagerRequest::Walk { path: "/d/f".into(), follow: true, open: OpenMode::None };
        let handle = match to(m.handle(&s, walk)).await {
            Ok(ManagerReply::Entry(e)) => e.handle(),
            other => panic!("walk: {other:?}"),
        };
        let txn = match to(m.handle(&s, ManagerRequest::BeginWrite { handle })).await {
            Ok(ManagerReply::Began { txn, .. }) => txn,
            other => panic!("begin: {other:?}"),
        };
        end_connection_once(&server, &db, "DELETE", "intents", "true");
        let commit = ManagerRequest::Commit { handle, txn, written_end: len, missed: vec![], dirty: vec![] };
        let size_of = |reply: Result<ManagerReply, nasd_manager::Failure>| match reply {
            Ok(ManagerReply::Entry(e)) => e.attr.size,
            other => panic!("commit: {other:?}"),
        };
        assert_eq!(size_of(to(m.handle(&s, commit.clone())).await), len, "committed");
        connection_was_ended(&server, &db);
        let intents = "SELECT 1 FROM intents";
        sql(
            &server,
            &db,
            &format!("DO $$ BEGIN IF NOT EXISTS ({intents}) THEN RAISE EXCEPTION 'none'; END IF; END $$"),
        )
        .expect("the committed intent is left behind");
        assert_eq!(size_of(to(m.handle(&s, commit.clone())).await), len, "sent again: answered as done");
        sql(&server, &db, &format!("DO $$ BEGIN IF EXISTS ({intents}) THEN RAISE EXCEPTION 'left'; END IF; END $$"))
            .expect("the intent is forgotten by the answer");
        match to(m.handle(&s, commit)).await {
            Err(f) => assert_eq!(f.status, FsStatus::Aborted, "{}", f.message),
            Ok(r) => panic!("a third time: {r:?}"),
        }
        assert!(to(admin.read_file("/d/f")).await.expect("read") == data, "the file as committed");
        drop(server);
    });
}

/// A `COMMIT` whose connection dies as it commits (a deferred trigger ends
/// its own server process, once) while the database takes no new
/// connections (`ALLOW_CONNECTIONS false`; the manager's open ones go on):
/// the metadata backend cannot ask whether it committed within
/// `COMMIT_OUTCOME_WAIT` (30 s), so the manager falls back to the write
/// intent (`resolve_commit`), which it reads on a connection it holds:
/// Open, so the writer is told `METADATA_UNAVAILABLE`, "send the commit
/// again", and once the database takes connections again the commit sent
/// again is made once. The write is acknowledged and reads back.
#[test]
fn a_commit_whose_outcome_stays_unknown_past_the_wait_is_resolved_by_its_intent() {
    let (server, url, db) = fresh_database();
    run(async move {
        let (cluster, _) = writer_on(&url).await;
        let (admin, told) = told_admin(&cluster).await;
        // Connections the manager keeps open (idle) through what follows.
        to(admin.write_file("/d/warm", &pattern(59, 100_000))).await.expect("a first write");
        sql(
            &server,
            &db,
            "CREATE SEQUENCE shot;
             CREATE FUNCTION end_connection() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF nextval('shot') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
               RETURN NULL;
             END $$;
             CREATE CONSTRAINT TRIGGER end_connection AFTER UPDATE ON intents DEFERRABLE INITIALLY DEFERRED
               FOR EACH ROW EXECUTE FUNCTION end_connection();",
        )
        .expect("the trigger");
        let connections = |allow: bool| {
            sql(&server, "postgres", &format!("ALTER DATABASE {db} WITH ALLOW_CONNECTIONS {allow}"))
                .expect("ALTER DATABASE")
        };
        connections(false);
        let data = pattern(61, 200_000);
        let reopen = async {
            // Until the writer is told to send its commit again (or its wait would end).
            let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
            while tokio::time::Instant::now() < deadline
                && !told.lock().unwrap().iter().any(|m| m.contains("send the commit again"))
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            connections(true);
        };
        let (written, ()) = tokio::join!(admin.write_file("/d/f", &data), reopen);
        written.expect("the write is acknowledged");
        let told = told.lock().unwrap().clone();
        assert!(told.iter().any(|m| m.contains("send the commit again") && m.contains(&db)), "{told:?}");
        assert!(to(admin.read_file("/d/f")).await.expect("read") == data, "the acknowledged bytes");
        assert_eq!(to(admin.stat("/d/f")).await.expect("stat").attr.size, data.len() as u64);
        drop(server);
    });
}

/// A truncation (`SETATTR` of size, which the manager carries out under a
/// write transaction of its own) whose commit loses its connection to
/// PostgreSQL before `COMMIT` is sent (at the update of the file's row to
/// the new size, once), after its write intent committed: nothing of the
/// commit was made, so the manager makes it again once the database
/// answers, and the client is told of no outage. Before, the truncation
/// failed as "partly done" (`INTERNAL`) and was rolled back.
#[test]
fn a_truncation_cut_off_before_its_commit_is_finished() {
    let (server, url, db) = fresh_database();
    run(async move {
        let (cluster, _) = writer_on(&url).await;
        let (admin, told) = told_admin(&cluster).await;
        let data = pattern(67, 300_000);
        to(admin.write_file("/d/f", &data)).await.expect("write");
        let ino = to(admin.stat("/d/f")).await.expect("stat").attr.ino;
        end_connection_once(&server, &db, "UPDATE", "inodes", &format!("OLD.ino = {ino} AND NEW.size = 1000"));
        let attr = to(admin.truncate("/d/f", 1000)).await.expect("the truncation is finished");
        assert_eq!(attr.size, 1000);
        connection_was_ended(&server, &db);
        assert_eq!(*told.lock().unwrap(), Vec::<String>::new(), "the manager waited the outage out");
        assert!(to(admin.read_file("/d/f")).await.expect("read") == data[..1000], "the file cut at 1000 bytes");
        drop(server);
    });
}
