//! Several authentication servers on one PostgreSQL database (a real server
//! the test starts): one set of users, roles, groups and shared keys.
//!
//! - A second server needs the first one's `auth.key` (refused without it,
//!   or with another), and learns the service token from the database.
//! - A seeded random sequence of rotations, retirements, logins and key
//!   checks, each at either server, against a model of the shared keys:
//!   a key rotated or retired through one server is what the other issues
//!   and answers from its next request on, ids only grow and never repeat.
//! - Both servers rotating, making groups and adding one user name at the
//!   same moment: distinct key ids and gids, one user made, the others told
//!   it exists.
//! - The state and its service token survive both servers closing.

use nasd_auth::{AuthConfig, AuthServer, Backing, Principal};
use nasd_meta::pg_connect::{PgOptions, PgTarget};
use nasd_meta::testing::PgServer;
use nasd_proto::auth::{AuthReply, AuthRequest};
use nasd_proto::fs::FsStatus;
use nasd_proto::limits::IDENTITY_KEYS_MAX;
use std::collections::BTreeSet;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

const ROOT: &str = "root";
const ROOT_PW: &str = "root password";

/// Guards a step against a hang (not a timing check).
async fn to<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(120), f).await.expect("step hung")
}

fn backing(url: &str) -> Backing {
    Backing::Postgres(Box::new(PgTarget::parse(url, &PgOptions::default()).unwrap()))
}

async fn open(dir: &Path, url: &str) -> anyhow::Result<AuthServer> {
    AuthServer::open_on(dir, AuthConfig::default(), backing(url)).await
}

fn copy_key(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    std::fs::copy(from.join(nasd_auth::AUTH_KEK_FILE), to.join(nasd_auth::AUTH_KEK_FILE)).unwrap();
}

/// The key id a login at `server` is issued under.
async fn login_key(server: &AuthServer) -> u32 {
    match to(server.login(ROOT, ROOT_PW, 0)).await.unwrap() {
        AuthReply::LoggedIn { credential, .. } => credential.key_id,
        other => panic!("{other:?}"),
    }
}

/// A small deterministic generator (xorshift64*), from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_database_are_one_server() {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let url = pg.fresh_url();
    let tmp = tempfile::tempdir().unwrap();
    let (dir_a, dir_b) = (tmp.path().join("auth-a"), tmp.path().join("auth-b"));

    let a = to(open(&dir_a, &url)).await.unwrap();
    assert!(!dir_a.join(nasd_auth::AUTH_DB).exists(), "no SQLite beside PostgreSQL");
    assert!(to(a.bootstrap_admin(ROOT, ROOT_PW, 0)).await.unwrap());

    // Without the first server's auth.key a second one is refused, and makes no key of its own.
    let err = to(open(&dir_b, &url)).await.err().expect("a server without auth.key joined").to_string();
    assert!(err.contains("--join") && err.contains(nasd_auth::AUTH_KEK_FILE), "{err}");
    assert!(!dir_b.join(nasd_auth::AUTH_KEK_FILE).exists());
    // With another auth.key too.
    let stranger = tmp.path().join("auth-stranger");
    std::fs::create_dir_all(&stranger).unwrap();
    nasd_crypto::create_key_file(&stranger.join(nasd_auth::AUTH_KEK_FILE), &nasd_crypto::Key::random()).unwrap();
    let err = to(open(&stranger, &url)).await.err().expect("another auth.key joined").to_string();
    assert!(err.contains("another auth.key"), "{err}");

    copy_key(&dir_a, &dir_b);
    let b = to(open(&dir_b, &url)).await.unwrap();
    assert_eq!(a.service_token(), b.service_token(), "one service token for the managers");
    assert_eq!(
        nasd_crypto::read_key_file(&dir_b.join(nasd_auth::SERVICE_TOKEN_FILE)).unwrap(),
        *a.service_token(),
        "written where the managers' configuration names it"
    );
    assert!(!to(b.bootstrap_admin(ROOT, "another password", 0)).await.unwrap(), "the administrator is there");
    assert!(b.service_login(a.service_token().expose()).is_ok());

    // A user added at one logs in at the other.
    to(b.add_user("alice", "alice password", 1000, 0, false)).await.unwrap();
    assert!(matches!(to(a.login("alice", "alice password", 0)).await, Ok(AuthReply::LoggedIn { uid: 1000, .. })));

    // Rotations, retirements, logins and checks at either server against a model.
    let seed = std::env::var("NASD_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    println!("seed {seed} (NASD_TEST_SEED={seed} repeats this run)");
    let mut rng = Rng(seed);
    let (mut high, mut live) = (1u32, BTreeSet::from([1u32]));
    let servers = [&a, &b];
    for step in 0..120 {
        let at = servers[rng.below(2) as usize];
        match rng.below(4) {
            0 => match to(at.rotate_key()).await {
                Ok(id) => {
                    assert!(live.len() < IDENTITY_KEYS_MAX, "step {step}: rotated past the bound");
                    assert_eq!(id, high + 1, "step {step}: ids grow by one across servers");
                    high = id;
                    live.insert(id);
                }
                Err((status, _)) => {
                    assert_eq!(status, FsStatus::NoSpace, "step {step}");
                    assert_eq!(live.len(), IDENTITY_KEYS_MAX, "step {step}: refused below the bound");
                }
            },
            1 => {
                let id = 1 + rng.below(u64::from(high) + 1) as u32;
                let outcome = to(at.retire_key(id)).await;
                if id > high {
                    assert_eq!(outcome.unwrap_err().0, FsStatus::InvalidArgument, "step {step}: never made");
                } else {
                    outcome.unwrap();
                    live.remove(&id);
                }
            }
            2 => {
                if let Some(&newest) = live.last() {
                    assert_eq!(login_key(at).await, newest, "step {step}: the newest live key at either server");
                } else {
                    let err = to(at.login(ROOT, ROOT_PW, 0)).await.unwrap_err();
                    assert_eq!(err.0, FsStatus::Internal, "step {step}: no key live");
                    to(at.rotate_key())
                        .await
                        .map(|id| {
                            high = id;
                            live.insert(id);
                        })
                        .unwrap();
                }
            }
            _ => {
                let id = 1 + rng.below(u64::from(high)) as u32;
                assert_eq!(to(at.key_live(id)).await.unwrap(), live.contains(&id), "step {step}: key {id}");
                let (h, keys) = to(at.shared_keys()).await.unwrap();
                assert_eq!(h, high, "step {step}");
                assert_eq!(keys.iter().map(|k| k.key_id).collect::<BTreeSet<_>>(), live, "step {step}");
            }
        }
    }
    // The same key bytes at both servers (one sealed copy in the database).
    let (ka, kb) = (to(a.shared_keys()).await.unwrap().1, to(b.shared_keys()).await.unwrap().1);
    assert!(ka.iter().zip(&kb).all(|(x, y)| x.key_id == y.key_id && x.key == y.key) && ka.len() == kb.len());

    // At the same moment: rotations (after making room), groups, one user name.
    for id in live.clone() {
        to(a.retire_key(id)).await.unwrap();
    }
    let (ra, rb) = to(async { tokio::join!(a.rotate_key(), b.rotate_key()) }).await;
    let mut made = BTreeSet::from([ra.unwrap(), rb.unwrap()]);
    assert_eq!(made, BTreeSet::from([high + 1, high + 2]), "two rotations at once, two ids");
    let (ra, rb) = to(async { tokio::join!(a.rotate_key(), b.rotate_key()) }).await;
    made.extend([ra.unwrap(), rb.unwrap()]);
    assert_eq!(made.len(), 4);
    let group = |n: u32| AuthRequest::CreateGroup { name: format!("g{n}") };
    let me = nasd_auth::Principal::User(1000);
    let (ga, gb) = to(async { tokio::join!(a.handle(me, group(1)), b.handle(me, group(2))) }).await;
    let gid = |r: Result<AuthReply, _>| match r.unwrap() {
        AuthReply::Group { gid, .. } => gid,
        other => panic!("{other:?}"),
    };
    assert_ne!(gid(ga), gid(gb), "groups made at once at two servers get two gids");
    let (ua, ub) = to(async {
        tokio::join!(
            a.add_user("carol", "carol pw 1", 1002, 0, false),
            b.add_user("carol", "carol pw 2", 1003, 0, false)
        )
    })
    .await;
    let refusals: Vec<_> = [ua, ub].into_iter().filter_map(Result::err).map(|e| e.0).collect();
    assert_eq!(refusals, [FsStatus::Exists], "one carol made, the other told");
    let token = a.service_token().clone();
    drop((a, b));

    // Reopened (both gone), the state is the database's.
    let c = to(open(&dir_b, &url)).await.unwrap();
    assert_eq!(c.service_token(), &token);
    assert_eq!(to(c.shared_keys()).await.unwrap().1.iter().map(|k| k.key_id).collect::<BTreeSet<_>>(), made);
    assert_eq!(to(c.user(1000)).await.unwrap().unwrap().groups.len(), 2);
}

/// `sql` in database `db` of `pg`, from a thread of its own (the helper
/// runs its own runtime, which an async test's cannot hold).
fn sql(pg: &PgServer, db: &str, sql: &str) -> Result<(), String> {
    std::thread::scope(|s| s.spawn(|| pg.execute(db, sql)).join().expect("the SQL thread"))
}

/// A statement cut off by the database server going away (its server
/// process ends itself, once, at the first insert of a user — as the
/// processes of a killed PostgreSQL end their statements in flight, SQLSTATE
/// 57P01) is `METADATA_UNAVAILABLE`, which clients wait out and send again,
/// not `INTERNAL`, which fails their command (found by `nasd-cli`'s
/// `netns_cluster`: a login in flight as PostgreSQL was killed); sent
/// again, it succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_the_server_cut_off_going_away_is_unavailable_not_internal() {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let url = pg.fresh_url();
    let db = url.rsplit('/').next().unwrap().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let server = to(open(tmp.path(), &url)).await.unwrap();
    sql(
        &pg,
        &db,
        "CREATE SEQUENCE shot;
         CREATE FUNCTION end_connection() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF nextval('shot') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER end_connection BEFORE INSERT ON auth_users FOR EACH ROW EXECUTE FUNCTION end_connection();",
    )
    .expect("the trigger");
    let cut = to(server.add_user("carol", "carol's password", 2001, 2001, false)).await;
    match cut {
        Err((status, message)) => {
            assert_eq!(status, FsStatus::MetadataUnavailable, "{message}");
            assert!(message.contains("cannot be reached"), "{message}");
        }
        Ok(()) => panic!("the insert was not cut off"),
    }
    to(server.add_user("carol", "carol's password", 2001, 2001, false)).await.expect("sent again, it is done");
    assert!(to(server.login("carol", "carol's password", 0)).await.is_ok());
}

/// `nasd auth migrate`'s move: a server whose state is in `auth.sqlite`
/// (users with passwords, a disabled one, a role held, a group with a
/// member, a rotated and a retired shared key, its service token) moved
/// into PostgreSQL. Opened on the database it serves the same: the same
/// logins and key ids, users with the same groups and roles, the same
/// service token; `auth.sqlite` is set aside; a second server joins it.
/// Moving into a database that holds state is refused and moves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_sqlite_state_moves_into_postgres_whole() {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let url = pg.fresh_url();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("auth");

    let (before, token, alice) = {
        let s = AuthServer::open(&dir, AuthConfig::default()).unwrap();
        assert!(to(s.bootstrap_admin(ROOT, ROOT_PW, 0)).await.unwrap());
        to(s.add_user("alice", "alice's password", 1000, 1000, false)).await.unwrap();
        to(s.add_user("bob", "bob's password", 1001, 1001, false)).await.unwrap();
        to(s.set_user_enabled("bob", false)).await.unwrap();
        to(s.add_role(7, "ops")).await.unwrap();
        to(s.set_user_role("alice", 7, true)).await.unwrap();
        let gid = match to(s.handle(Principal::User(1000), AuthRequest::CreateGroup { name: "team".into() })).await {
            Ok(AuthReply::Group { gid, .. }) => gid,
            other => panic!("{other:?}"),
        };
        to(s.handle(Principal::User(0), AuthRequest::SetGroupMember { gid, user: "bob".into(), member: true }))
            .await
            .unwrap();
        assert_eq!(to(s.rotate_key()).await.unwrap(), 2);
        to(s.retire_key(1)).await.unwrap();
        assert_eq!(login_key(&s).await, 2);
        let alice = to(s.user(1000)).await.unwrap().unwrap();
        assert_eq!((alice.groups.clone(), alice.roles.clone()), (vec![gid], vec![7]));
        let mut before = Vec::new();
        for u in [0, 1000, 1001] {
            before.push(user_at(&s, u).await);
        }
        (before, s.service_token().clone(), alice)
    };

    // Into a database that holds state already: refused, nothing moved, auth.sqlite kept.
    let taken = pg.fresh_url();
    {
        let other = tmp.path().join("other");
        let s = to(open(&other, &taken)).await.unwrap();
        assert!(to(s.bootstrap_admin(ROOT, ROOT_PW, 0)).await.unwrap());
    }
    let target = |u: &str| PgTarget::parse(u, &PgOptions::default()).unwrap();
    let err = nasd_auth::migrate_to_postgres(&dir, target(&taken)).await.unwrap_err().to_string();
    assert!(err.contains("holds an authentication server's state already"), "{err}");
    assert!(dir.join(nasd_auth::AUTH_DB).exists());

    let moved = to(nasd_auth::migrate_to_postgres(&dir, target(&url))).await.expect("moved");
    assert_eq!((moved.users, moved.roles, moved.groups, moved.shared_keys), (3, 1, 1, 2));
    assert!(!dir.join(nasd_auth::AUTH_DB).exists(), "auth.sqlite set aside");
    assert!(moved.old_file.exists());
    let again = nasd_auth::migrate_to_postgres(&dir, target(&url)).await.unwrap_err().to_string();
    assert!(again.contains("nothing to move"), "{again}");

    let s = to(open(&dir, &url)).await.unwrap();
    assert!(s.store_name().starts_with("postgres://"), "{}", s.store_name());
    assert!(nasd_crypto::ct_eq(s.service_token().expose(), token.expose()), "the same service token");
    assert_eq!(login_key(&s).await, 2, "the same shared keys, key 1 retired");
    assert!(to(s.login("alice", "alice's password", 7)).await.is_ok(), "alice's password and role");
    assert!(to(s.login("bob", "bob's password", 0)).await.is_err(), "bob stays disabled");
    assert_eq!(to(s.user(1000)).await.unwrap().unwrap(), alice);
    for (u, was) in [0, 1000, 1001].iter().zip(&before) {
        assert_eq!(&user_at(&s, *u).await, was, "user {u}");
    }
    // A second server on the database: the same state.
    let second = tmp.path().join("second");
    copy_key(&dir, &second);
    let s2 = to(open(&second, &url)).await.unwrap();
    assert_eq!(login_key(&s2).await, 2);
    assert!(nasd_crypto::ct_eq(s2.service_token().expose(), token.expose()));
}

/// User `uid` as the server answers for it.
async fn user_at(s: &AuthServer, uid: u32) -> Option<nasd_proto::auth::AuthUser> {
    to(s.user(uid)).await.unwrap()
}
