//! The PostgreSQL backend on a real server ([`PgServer`], started by the
//! test itself): the conformance suite, conflicting transactions from two
//! backends (two managers) retried to a correct end, the three kinds of
//! failure, and the schema's version handling.

use nasd_meta::testing::{check_invariants, conformance, pool_placer, snapshot, PgServer, PgServerOptions};
use nasd_meta::{
    Access, Backend, Caller, DriveRecord, DriveState, FsStatus, Layout, MetaError, Namespace, ObjectRef, Postgres,
    TxnError, POSTGRES_SCHEMA_VERSION, ROOT_INO,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, OnceLock};
use std::time::Duration;

/// One server for the whole test binary; it goes away with the process.
fn server() -> &'static PgServer {
    static SERVER: OnceLock<PgServer> = OnceLock::new();
    SERVER.get_or_init(|| PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}")))
}

fn open(url: &str) -> Postgres {
    Postgres::open(url).unwrap_or_else(|e| panic!("open {url}: {e}"))
}

/// Runs `statements` on `url` directly (not through the backend).
fn raw_sql(url: &str, statements: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
        let conn = tokio::spawn(connection);
        client.batch_execute(statements).await.unwrap();
        drop(client);
        let _ = conn.await;
    });
}

/// The id of a transaction of its own on `url` (directly, not through the
/// backend), which commits: `SELECT txid_current()` outside a transaction.
fn committed_txid(url: &str) -> i64 {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
        let conn = tokio::spawn(connection);
        let id: i64 = client.query_one("SELECT txid_current()", &[]).await.unwrap().get(0);
        drop(client);
        let _ = conn.await;
        id
    })
}

#[test]
fn conformance_on_postgres() {
    let s = server();
    conformance(|| open(&s.fresh_url()));
}

const PARTITION: u64 = 7;
const POOLED: u64 = 8;

/// A name space on a new database with drive 1 and [`POOLED`] objects in its pool.
fn fresh_namespace(url: &str) -> Namespace<Postgres> {
    let ns = Namespace::new(open(url), Layout::SINGLE).unwrap();
    ns.add_drive(&DriveRecord {
        drive: 1,
        drive_id: [1; 16],
        addr: "127.0.0.1:1".into(),
        partition: PARTITION,
        sealed_keys: vec![1; 48],
        capacity_bytes: 1 << 30,
        failure_domain: String::new(),
        state: DriveState::In,
    })
    .unwrap();
    let objects: Vec<ObjectRef> =
        (100..100 + POOLED).map(|object| ObjectRef { drive: 1, partition: PARTITION, object }).collect();
    ns.pool_add(&objects).unwrap();
    ns
}

/// Two managers (two backends on one database) create the same name at the
/// same moment. Their read-write transactions run at once; the one that
/// conflicts is rolled back and run again on what the other committed: one
/// makes the file, the other finds the name and reports `Exists` (an
/// exclusive create) or opens the file (a non-exclusive one). Nothing is
/// lost or held twice: one file, one object gone from the pool.
#[test]
fn concurrent_creates_of_one_name_from_two_managers_serialize() {
    let url = server().fresh_url();
    let first = fresh_namespace(&url);
    let second = Namespace::new(open(&url), Layout::SINGLE).unwrap();
    for exclusive in [true, false] {
        let name = format!("same-{exclusive}");
        let met = Barrier::new(2);
        let placements = AtomicUsize::new(0);
        let results: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = [&first, &second]
                .into_iter()
                .map(|ns| {
                    let (met, placements, name) = (&met, &placements, name.clone());
                    scope.spawn(move || {
                        let mut placer = pool_placer(&[1]);
                        let mut place = |layout: &Layout, t: &mut dyn nasd_meta::Txn| {
                            placements.fetch_add(1, Ordering::SeqCst);
                            placer(layout, t)
                        };
                        met.wait();
                        ns.create(&Caller::ROOT, ROOT_INO, &name, 0o644, exclusive, false, &mut place)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let made: Vec<_> = results.iter().filter(|r| matches!(r, Ok((_, true)))).collect();
        assert_eq!(made.len(), 1, "exactly one create makes the file: {results:?}");
        let loser = results.iter().find(|r| !matches!(r, Ok((_, true)))).unwrap();
        if exclusive {
            assert_eq!(loser.as_ref().err(), Some(&FsStatus::Exists), "{results:?}");
        } else {
            let (opened, created) = loser.as_ref().expect("a non-exclusive create opens the file");
            assert!(!created);
            assert_eq!(opened.attr.ino, made[0].as_ref().unwrap().0.attr.ino, "the same file");
        }
        // The second placed too only in an attempt that conflicted and was rolled back.
        let conflicts = first.backend().conflicts() + second.backend().conflicts();
        assert!(placements.load(Ordering::SeqCst) as u64 <= 1 + conflicts, "{results:?}");
    }
    check_invariants(&first);
    assert_eq!(first.pool_len(1).unwrap(), POOLED as usize - 2, "one object per file made, none lost");
    assert_eq!(snapshot(&first), snapshot(&second), "both managers see the same state");
}

/// A transaction that does conflict — here with a raw connection changing
/// the row it read — is rolled back, counted ([`Postgres::conflicts`]) and
/// run again on the new value: no increment is lost. Then many increments
/// of one row from two managers at once, unsynchronized: they conflict all
/// the time, and the count is exact, none fails (an attempt that conflicted
/// [`nasd_meta::CONFLICTS_BEFORE_ALONE`] times runs alone).
#[test]
fn conflicts_are_retried_and_increments_from_two_managers_lose_nothing() {
    let url = server().fresh_url();
    let backends = [open(&url), open(&url)];
    let read = |t: &mut dyn nasd_meta::Txn| -> Result<u64, FsStatus> {
        Ok(t.get_setting("counter")?.map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap())))
    };
    backends[0].transact(|t| t.put_setting("counter", &1u64.to_le_bytes())).unwrap();
    let runs = AtomicUsize::new(0);
    backends[0]
        .try_transact(|t| {
            let n = read(t)?;
            if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                // Committed after this transaction's snapshot: its write below conflicts.
                raw_sql(&url, "UPDATE settings SET value = '\\x0200000000000000'::BYTEA WHERE key = 'counter'");
            }
            t.put_setting("counter", &(n + 1).to_le_bytes())
        })
        .unwrap();
    assert_eq!(backends[0].read(read).unwrap(), 3, "the raw write's 2, plus one");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "ran again after its conflict");
    assert_eq!(backends[0].conflicts(), 1, "the conflict is counted");

    const EACH: u64 = 50;
    std::thread::scope(|scope| {
        for b in &backends {
            scope.spawn(move || {
                for _ in 0..EACH {
                    b.transact(|t| {
                        let n = read(t)?;
                        t.put_setting("counter", &(n + 1).to_le_bytes())
                    })
                    .unwrap();
                }
            });
        }
    });
    assert_eq!(backends[1].read(read).unwrap(), 3 + 2 * EACH);
    let (conflicts, alone) =
        (backends[0].conflicts() + backends[1].conflicts(), backends[0].alone() + backends[1].alone());
    eprintln!("{conflicts} conflicts, {alone} attempts alone");
    assert!(alone <= conflicts, "only an attempt after conflicts runs alone: {alone} of {conflicts}");
}

/// Two managers (two backends on one database) try for the same leases
/// again and again at once: every round exactly one holds each lease, and
/// the loser cannot pass its fence. The fence is checked against the database,
/// so only the round's winner records objects under it.
#[test]
fn a_lease_is_held_by_one_manager_at_a_time() {
    let url = server().fresh_url();
    let managers = [fresh_namespace(&url), Namespace::new(open(&url), Layout::SINGLE).unwrap()];
    let ttl = std::time::Duration::from_secs(3600);
    for round in 0..20u64 {
        let met = Barrier::new(2);
        let won: Vec<Option<nasd_meta::Lease>> = std::thread::scope(|scope| {
            let handles: Vec<_> = managers
                .iter()
                .enumerate()
                .map(|(i, ns)| {
                    let met = &met;
                    scope.spawn(move || {
                        met.wait();
                        ns.acquire_lease("drive/1", &format!("manager-{i}"), ttl).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<&nasd_meta::Lease> = won.iter().flatten().collect();
        assert_eq!(winners.len(), 1, "round {round}: exactly one manager holds the lease: {won:?}");
        let lease = winners[0].clone();
        assert_eq!(managers[1].lease("drive/1").unwrap().as_ref(), Some(&lease), "the database holds the winner");
        let other = if lease.holder == "manager-0" { "manager-1" } else { "manager-0" };
        let stale = nasd_meta::Lease { holder: other.to_string(), ..lease.clone() };
        let object = ObjectRef { drive: 1, partition: PARTITION, object: 1000 + round };
        assert_eq!(managers[0].pool_add_fenced(&[object], &stale).err(), Some(FsStatus::Busy));
        managers[1].pool_add_fenced(&[object], &lease).unwrap();
        assert!(managers[0].release_lease(&lease).unwrap());
    }
}

/// The closure's own error is an abort (run once, not retried); a failed
/// statement is a storage failure even if the closure swallows it, and
/// nothing of that attempt commits; a row that does not decode is a storage
/// failure too.
#[test]
fn aborts_and_storage_failures_are_told_apart_and_not_retried() {
    let url = server().fresh_url();
    let ns = Namespace::new(open(&url), Layout::SINGLE).unwrap();
    let b = ns.backend();
    let runs = AtomicUsize::new(0);
    let r: Result<(), _> = b.try_transact(|t| {
        runs.fetch_add(1, Ordering::SeqCst);
        t.put_setting("k", b"v")?;
        Err(FsStatus::Exists)
    });
    assert_eq!((r, runs.load(Ordering::SeqCst)), (Err(TxnError::Abort(FsStatus::Exists)), 1));

    runs.store(0, Ordering::SeqCst);
    let r = b.try_transact(|t| {
        runs.fetch_add(1, Ordering::SeqCst);
        // A dangling entry: the foreign key refuses it, and the closure ignores the error.
        let _ = t.insert_dirent(ROOT_INO, "dangling", 1 << 40);
        let _ = t.put_setting("k", b"v");
        Ok(())
    });
    assert_eq!((r, runs.load(Ordering::SeqCst)), (Err(TxnError::Storage), 1));
    assert_eq!(b.read(|t| t.get_setting("k")).unwrap(), None, "nothing of the failed attempt committed");
    assert_eq!(b.transact(|t| t.put_setting("k", b"v")), Ok(()), "the connection serves on");

    assert_eq!(b.try_read(|t| t.put_setting("k", b"w")), Err(TxnError::Storage), "read-only");
    assert_eq!(b.attempt(Access::ReadOnly, &mut |t| t.get_setting("k")), Ok(Some(b"v".to_vec())));

    raw_sql(&url, "UPDATE inodes SET kind = 99 WHERE ino = 1");
    assert_eq!(b.try_read(|t| t.get_inode(ROOT_INO)), Err(TxnError::Storage), "an undecodable row");
    assert_eq!(ns.getattr(ROOT_INO).err(), Some(FsStatus::Internal));
}

/// A new database is made with the schema on first use, also by two
/// backends opening it at once; the version is recorded; a newer one is
/// refused; an unreachable server is a clear error that shows no password.
#[test]
fn schema_is_created_once_and_versions_are_checked() {
    let s = server();
    let url = s.fresh_url();
    let opened: Vec<Postgres> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..3).map(|_| scope.spawn(|| open(&url))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for b in &opened {
        assert_eq!(b.schema_version().unwrap(), POSTGRES_SCHEMA_VERSION);
    }
    let first = opened[0].transact(|t| t.alloc_ino()).unwrap();
    assert_eq!(first, nasd_meta::INO_BLOCK, "block 1 (block 0 holds the root, 1)");
    assert_eq!(opened[0].transact(|t| t.alloc_ino()).unwrap(), first + 1, "a connection's block, in order");
    let other = opened[1].transact(|t| t.alloc_ino()).unwrap();
    assert_eq!(other, 2 * nasd_meta::INO_BLOCK, "another backend's connection: the next block");
    let t1 = opened[1].transact(|t| t.alloc_txn()).unwrap();
    drop(opened);
    let b = open(&url);
    assert!(b.transact(|t| t.alloc_ino()).unwrap() > other, "inode numbers go on after a reopen");
    assert!(b.transact(|t| t.alloc_txn()).unwrap() > t1);
    drop(b);

    raw_sql(&url, &format!("UPDATE nasd_schema SET version = {}", POSTGRES_SCHEMA_VERSION + 1));
    match Postgres::open(&url) {
        Err(MetaError::TooNew { found, supported }) => {
            assert_eq!((found, supported), (POSTGRES_SCHEMA_VERSION + 1, POSTGRES_SCHEMA_VERSION))
        }
        other => panic!("a newer schema was not refused: {other:?}"),
    }

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let e = Postgres::open(&format!("postgres://nasd:s3cret@127.0.0.1:{closed}/meta")).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, MetaError::Postgres { .. }), "{text}");
    assert!(text.contains(&format!("postgres://nasd@127.0.0.1:{closed}/meta")), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
}

/// Four managers on one database, each making files in a directory of its
/// own, one request at a time as `nasd bench untar` sends them (lookup,
/// getattr of the directory, exclusive create, getattr, lookup, chmod,
/// utimes), while the first refills the drive's pool under the drive's
/// lease: every request succeeds. Their writers run at once (no turn across
/// backends): a transaction that conflicts is rolled back and run again
/// inside the backend, never reported. A first round fills the indexes
/// past their first pages, as any name space in use has them; the second
/// round is the one counted. Conflicts are printed by statement (the
/// server's log), not asserted: they cost time, not correctness.
#[test]
fn creates_in_separate_directories_from_four_managers_all_succeed() {
    const MANAGERS: usize = 4;
    const FILES: u64 = 120;
    const REFILLS: u64 = 10;
    let url = server().fresh_url();
    let db = url.rsplit('/').next().unwrap().to_owned();
    let first = fresh_namespace(&url);
    let mut managers = vec![first];
    for _ in 1..MANAGERS {
        managers.push(Namespace::new(open(&url), Layout::SINGLE).unwrap());
    }
    // Enough pooled objects for every file, beyond the POOLED ones.
    let spare: Vec<ObjectRef> = (1000..1000 + 2 * MANAGERS as u64 * FILES)
        .map(|object| ObjectRef { drive: 1, partition: PARTITION, object })
        .collect();
    for chunk in spare.chunks(256) {
        managers[0].pool_add(chunk).unwrap();
    }
    // Warm-up, one manager after the other: the indexes grow past their first pages.
    for (m, ns) in managers.iter().enumerate() {
        let dir = ns.mkdir(&Caller::ROOT, ROOT_INO, &format!("warm-{m}"), 0o755).unwrap();
        untar_files(ns, dir.attr.ino, FILES).unwrap();
    }
    for round in 0..1 {
        let dirs: Vec<_> = (managers.iter().enumerate())
            .map(|(m, ns)| ns.mkdir(&Caller::ROOT, ROOT_INO, &format!("dir-{round}-{m}"), 0o755).unwrap())
            .collect();
        let before: Vec<u64> = managers.iter().map(|ns| ns.backend().conflicts()).collect();
        let failures_before = server().serialization_failures(&db);
        let start = Barrier::new(MANAGERS + 1);
        let outcomes: Vec<Result<(), String>> = std::thread::scope(|scope| {
            // The maintenance pass of the first manager, refilling the pool under the drive's lease.
            let refills = scope.spawn(|| {
                start.wait();
                for n in 0..REFILLS {
                    let lease = managers[0].acquire_lease("drive/1", "manager-0", Duration::from_secs(60))?;
                    let lease = lease.expect("no one else holds the drive's lease");
                    managers[0].pool_len(1)?;
                    let at = 100_000 + (round * REFILLS + n) * 16;
                    let objects: Vec<ObjectRef> =
                        (at..at + 16).map(|object| ObjectRef { drive: 1, partition: PARTITION, object }).collect();
                    managers[0].pool_add_fenced(&objects, &lease)?;
                    managers[0].release_lease(&lease)?;
                }
                Ok::<_, FsStatus>(())
            });
            let threads: Vec<_> = managers
                .iter()
                .zip(&dirs)
                .map(|(ns, dir)| {
                    let (start, dir) = (&start, dir.attr.ino);
                    scope.spawn(move || {
                        start.wait();
                        untar_files(ns, dir, FILES)
                    })
                })
                .collect();
            let outcomes = threads.into_iter().map(|t| t.join().unwrap()).collect();
            refills.join().unwrap().expect("refills");
            outcomes
        });
        let conflicts: Vec<u64> = managers.iter().zip(&before).map(|(ns, b)| ns.backend().conflicts() - b).collect();
        let failures = server().serialization_failures(&db) - failures_before;
        let alone: Vec<u64> = managers.iter().map(|ns| ns.backend().alone()).collect();
        eprintln!("round {round}: conflicts per manager {conflicts:?}, {failures} serialization failures logged; attempts alone {alone:?}");
        eprintln!("{}", failures_by_statement(&db));
        assert_eq!(outcomes, vec![Ok(()); MANAGERS], "every request of round {round} succeeds");
    }
    check_invariants(&managers[0]);
}

/// The serialization failures the server logged in database `db` so far,
/// counted by the statement that failed (its first 70 characters).
fn failures_by_statement(db: &str) -> String {
    let log = server().log();
    let tag = format!(" db={db} ");
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(&tag)).collect();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for (i, l) in lines.iter().enumerate() {
        if !l.contains("could not serialize access") {
            continue;
        }
        let statement = lines[i + 1..]
            .iter()
            .take(3)
            .find_map(|l| l.split_once("STATEMENT:  ").map(|(_, s)| s.chars().take(70).collect::<String>()))
            .unwrap_or_else(|| "?".into());
        *counts.entry(statement).or_default() += 1;
    }
    let mut by_count: Vec<_> = counts.into_iter().collect();
    by_count.sort_by_key(|b| std::cmp::Reverse(b.1));
    by_count.iter().map(|(s, n)| format!("  {n:>5}  {s}\n")).collect()
}

/// What `nasd bench untar` asks a manager for per file, for `files` files
/// in `dir`; the first failure, said.
fn untar_files(ns: &Namespace<Postgres>, dir: u64, files: u64) -> Result<(), String> {
    let mut placer = pool_placer(&[1]);
    for f in 0..files {
        let name = format!("f{f}.c");
        let fail = |what: &str, e: FsStatus| format!("{what} {name}: {e:?}");
        match ns.lookup(&Caller::ROOT, dir, &name) {
            Err(FsStatus::NotFound) => {}
            other => return Err(format!("lookup {name} before: {other:?}")),
        }
        ns.getattr(dir).map_err(|e| fail("getattr of the directory of", e))?;
        let (made, created) =
            ns.create(&Caller::ROOT, dir, &name, 0o600, true, false, &mut placer).map_err(|e| fail("create", e))?;
        if !created {
            return Err(format!("{name} existed"));
        }
        let ino = made.attr.ino;
        ns.getattr(ino).map_err(|e| fail("getattr", e))?;
        let found = ns.lookup(&Caller::ROOT, dir, &name).map_err(|e| fail("lookup", e))?;
        if found.attr.ino != ino {
            return Err(format!("lookup {name} found another inode"));
        }
        let chmod = nasd_meta::SetAttrs { mode: Some(0o644), ..Default::default() };
        ns.setattr(&Caller::ROOT, ino, &chmod).map_err(|e| fail("chmod", e))?;
        let t = 946_684_800_000_000_000 + f as i64;
        let times = nasd_meta::SetAttrs { atime_ns: Some(t), mtime_ns: Some(t), ..Default::default() };
        ns.setattr(&Caller::ROOT, ino, &times).map_err(|e| fail("utimes", e))?;
    }
    Ok(())
}

/// A `COMMIT` whose connection the server ends as it commits (a deferred
/// trigger, run at commit time, ends its own server process, once): the
/// backend asks the server on a new connection whether the transaction
/// (`txid_current()`, taken with its `BEGIN`) committed. It did not, so the
/// attempt is `Unavailable` — nothing changed, which a manager's client
/// waits out and sends again — not `Storage` ("may have committed"), as
/// before; sent again, it is done once (found by `nasd-cli`'s
/// `netns_cluster`: a write in flight as PostgreSQL was killed).
#[test]
fn a_commit_cut_off_by_the_server_is_told_apart_as_not_made() {
    let url = server().fresh_url();
    let backend = open(&url);
    raw_sql(
        &url,
        "CREATE SEQUENCE shot;
         CREATE FUNCTION end_connection() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF nextval('shot') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
           RETURN NULL;
         END $$;
         CREATE CONSTRAINT TRIGGER end_connection AFTER INSERT ON settings DEFERRABLE INITIALLY DEFERRED
           FOR EACH ROW EXECUTE FUNCTION end_connection();",
    );
    let cut = backend.try_transact(|t| t.put_setting("once", b"1"));
    assert_eq!(cut.err(), Some(TxnError::Unavailable), "the commit was not made, and the backend knows it");
    assert_eq!(backend.read(|t| t.get_setting("once")).unwrap(), None, "nothing changed");
    backend.transact(|t| t.put_setting("once", b"1")).expect("sent again");
    assert_eq!(backend.read(|t| t.get_setting("once")).unwrap().as_deref(), Some(&b"1"[..]));
}

/// A `COMMIT` cut off by the server's crash (SIGKILL with the transaction
/// open, none of its log written yet) did not commit — also when the
/// restarted server has handed its transaction id out again and the
/// transaction that got it committed, so that `txid_status` of the id says
/// "committed". The backend took that for its own commit: the attempt
/// succeeded and its change was not there (found by `nasd-cli`'s
/// `netns_cluster`: a put acknowledged while its write's `COMMIT` was lost
/// in PostgreSQL's crash read back short). Its own mark tells it apart:
/// `Unavailable`, and sent again it is done once.
#[test]
fn a_commit_lost_in_a_crash_is_not_taken_for_the_transaction_that_got_its_id_again() {
    let mut s = PgServer::start_with(&PgServerOptions { durable_commits: true, ..PgServerOptions::default() })
        .unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let url = s.fresh_url();
    let backend = open(&url);
    backend.transact(|t| t.put_setting("before", b"1")).unwrap();
    let last = committed_txid(&url);
    let mut after_restart: Option<Vec<i64>> = None;
    let cut = backend.try_transact(|t| {
        t.put_setting("lost", b"1")?;
        if after_restart.is_none() {
            // The server crashes with this transaction open, comes back, and other clients'
            // transactions commit, before this one's COMMIT is sent.
            s.kill().expect("killed");
            // Its server processes notice the postmaster gone and end (else the new one refuses to start).
            std::thread::sleep(Duration::from_secs(1));
            s.start_again().expect("started again");
            after_restart = Some((0..20).map(|_| committed_txid(&url)).collect());
        }
        Ok(())
    });
    let ids = after_restart.expect("the attempt ran");
    assert!(
        ids[0] <= last + 1,
        "the premise: the restarted server hands out again the ids of the transactions it lost (the last before \
         the crash {last}, after it {ids:?})"
    );
    assert_eq!(backend.read(|t| t.get_setting("lost")).unwrap(), None, "the crash lost the change");
    assert_eq!(cut.err(), Some(TxnError::Unavailable), "the commit was not made, and the backend knows it");
    backend.transact(|t| t.put_setting("lost", b"1")).expect("sent again");
    assert_eq!(backend.read(|t| t.get_setting("lost")).unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(backend.read(|t| t.get_setting("before")).unwrap().as_deref(), Some(&b"1"[..]));
}

/// Each read-write transaction sets its backend's row of `commit_marks`;
/// rows not set for `COMMIT_MARK_KEEP_DAYS` (backends long gone) are
/// removed when a backend opens the database, the others stay.
#[test]
fn commit_marks_of_backends_long_gone_are_removed_at_open() {
    let url = server().fresh_url();
    let backend = open(&url);
    backend.transact(|t| t.put_setting("k", b"v")).unwrap();
    let marks = |url: &str| -> Vec<i64> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
            let conn = tokio::spawn(connection);
            let rows = client.query("SELECT writer FROM commit_marks ORDER BY writer", &[]).await.unwrap();
            drop(client);
            let _ = conn.await;
            rows.iter().map(|r| r.get(0)).collect()
        })
    };
    let own = marks(&url);
    assert_eq!(own.len(), 1, "the backend's own row: {own:?}");
    let days = nasd_meta::COMMIT_MARK_KEEP_DAYS;
    raw_sql(
        &url,
        &format!(
            "INSERT INTO commit_marks VALUES (1, 5, now() - interval '{} days'), (2, 5, now() - interval '{} days')",
            days + 1,
            days - 1
        ),
    );
    let _again = open(&url);
    let mut expected = vec![2, own[0]];
    expected.sort_unstable();
    assert_eq!(marks(&url), expected, "the row not set for longer than {days} days removed");
}

/// xorshift64, for the seeded tests.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Several managers on one database, with two threads on the last (its
/// writers at once too), create, rename and unlink names at random — in a
/// directory of each thread's own and in one all share, and from one to
/// the other — from a printed seed (`NASD_TEST_SEED` to replay; the
/// interleaving is the machine's). No request fails but as the name space
/// says it must (`NotFound` for a name another thread removed, `Exists` for
/// an exclusive create of a name there): a conflict between managers never
/// reaches a caller. Afterwards the name space holds its invariants, every
/// manager sees the same state, and every object is a file's, the pool's or
/// the doomed log's.
#[test]
fn concurrent_creates_renames_and_unlinks_from_several_managers_reach_no_caller() {
    const MANAGERS: usize = 3;
    const THREADS: usize = MANAGERS + 1;
    const OPS: u64 = 120;
    const NAMES: u64 = 12;
    let seed = std::env::var("NASD_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    }) | 1;
    eprintln!("seed {seed} (NASD_TEST_SEED={seed} replays the choices)");
    let url = server().fresh_url();
    let db = url.rsplit('/').next().unwrap().to_owned();
    let mut managers = vec![fresh_namespace(&url)];
    for _ in 1..MANAGERS {
        managers.push(Namespace::new(open(&url), Layout::SINGLE).unwrap());
    }
    let spare: Vec<ObjectRef> = (1000..1000 + THREADS as u64 * OPS)
        .map(|object| ObjectRef { drive: 1, partition: PARTITION, object })
        .collect();
    for chunk in spare.chunks(256) {
        managers[0].pool_add(chunk).unwrap();
    }
    let shared = managers[0].mkdir(&Caller::ROOT, ROOT_INO, "shared", 0o755).unwrap().attr.ino;
    let own: Vec<u64> = (0..THREADS)
        .map(|i| {
            let ns = &managers[i.min(MANAGERS - 1)];
            ns.mkdir(&Caller::ROOT, ROOT_INO, &format!("own-{i}"), 0o755).unwrap().attr.ino
        })
        .collect();
    let start = Barrier::new(THREADS);
    let failures: Vec<String> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|i| {
                let (ns, start, own) = (&managers[i.min(MANAGERS - 1)], &start, own[i]);
                scope.spawn(move || {
                    let mut rng = Rng(seed.wrapping_mul(i as u64 + 1) | 1);
                    let mut placer = pool_placer(&[1]);
                    let mut failures = Vec::new();
                    start.wait();
                    for n in 0..OPS {
                        let dir = |rng: &mut Rng| if rng.below(2) == 0 { own } else { shared };
                        let name = |rng: &mut Rng| format!("n{}", rng.below(NAMES));
                        let (from, name1) = (dir(&mut rng), name(&mut rng));
                        let op = rng.below(4);
                        let outcome = match op {
                            0 | 1 => ns
                                .create(&Caller::ROOT, from, &name1, 0o644, true, false, &mut placer)
                                .map(drop)
                                .or_else(|e| if e == FsStatus::Exists { Ok(()) } else { Err(e) }),
                            2 => ns.unlink(&Caller::ROOT, from, &name1).map(drop),
                            _ => {
                                let (to, name2) = (dir(&mut rng), name(&mut rng));
                                ns.rename(&Caller::ROOT, from, &name1, to, &name2).map(drop)
                            }
                        };
                        match outcome {
                            Ok(()) | Err(FsStatus::NotFound) => {}
                            Err(e) => failures.push(format!("thread {i}, op {n} ({op}) on {name1}: {e:?}")),
                        }
                    }
                    failures
                })
            })
            .collect();
        threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
    });
    let conflicts: u64 = managers.iter().map(|ns| ns.backend().conflicts()).sum();
    let alone: u64 = managers.iter().map(|ns| ns.backend().alone()).sum();
    eprintln!("seed {seed}: {conflicts} conflicts retried, {alone} attempts alone");
    eprintln!("{}", failures_by_statement(&db));
    assert_eq!(failures, Vec::<String>::new(), "seed {seed}: failures reached callers");
    check_invariants(&managers[0]);
    for ns in &managers[1..] {
        assert_eq!(snapshot(ns), snapshot(&managers[0]), "seed {seed}: every manager sees one state");
    }
    // Every object given to the pool is in exactly one place: a file, the pool or the doomed log.
    let state = snapshot(&managers[0]);
    let mut held: Vec<ObjectRef> = state.tree.iter().flat_map(|(_, n)| n.components.iter().map(|c| c.object)).collect();
    held.extend(state.pool.iter().copied());
    held.extend(state.doomed.iter().copied());
    held.sort();
    let mut given: Vec<ObjectRef> = (100..100 + POOLED)
        .chain(1000..1000 + THREADS as u64 * OPS)
        .map(|object| ObjectRef { drive: 1, partition: PARTITION, object })
        .collect();
    given.sort();
    assert_eq!(held, given, "seed {seed}: objects lost or held twice");
}
