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

use nasd_auth::{AuthConfig, AuthServer, Backing};
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
