//! The authentication server (`nasd_auth`, DSFS §3.1) with the manager and
//! drives, end to end over real daemons on loopback: password login and
//! role choice at the authentication server, the identity key it issues
//! accepted by the manager (`LOGIN_IDENTITY`) and by drives (once the
//! manager installed the shared keys, `SYNC_IDENTITY_KEYS`), groups users
//! make themselves, and what must be refused: wrong passwords, roles not
//! held, disabled users, forged or tampered credentials, expired identity
//! keys, retired key ids — while rotation leaves the others' keys working.

#[path = "common/auth_server.rs"]
mod auth_server;
mod common;
#[path = "common/guessing.rs"]
mod guessing;

use auth_server::{Auth0, ROOT, ROOT_PW};
use common::*;
use nasd_auth::{AuthConfig, AuthServer};
use nasd_client::{Auth, ClientError, Credential, DriveClient};
use nasd_crypto::{identity_key, identity_login_proof, Key};
use nasd_fs::{BoxFuture, FsClient, FsConfig, FsError, FsStatus, IdentitySource};
use nasd_login::auth_client::{AuthClient, AuthError};
use nasd_manager::ManagerConfig;
use nasd_proto::{rights, AuthScheme, IdentityData, ObjectPal, Pal, PalEntry, Principal, Protection, Region, Status};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

const STAFF: u32 = 7;
const AUDIT: u32 = 9;
const CAROL: &str = "carol";
const PW_C: &str = "carol password";
const UID_C: u32 = 1002;
const DATA: &[u8] = b"read by identity, checked by the drive";

/// Test-only renewal: see [`Relogin`].
impl Auth0 {
    /// A renewal source logging `user` in again, as `nasd mount` does.
    fn source(&self, user: &str, password: &str, role: u32) -> Arc<dyn IdentitySource> {
        Arc::new(Relogin {
            addr: self.addr.clone(),
            ca: self.ca.clone(),
            user: user.into(),
            password: password.into(),
            role,
        })
    }
}

/// Logs a user in at the authentication server again for a fresh identity.
struct Relogin {
    addr: String,
    ca: PathBuf,
    user: String,
    password: String,
    role: u32,
}

impl IdentitySource for Relogin {
    fn fresh(&self) -> BoxFuture<'_, Result<(IdentityData, Key), FsError>> {
        Box::pin(async move {
            let tls = nasd_login::auth_client::connector(&self.ca).map_err(|e| FsError::Setup(e.to_string()))?;
            let (_, grant) = AuthClient::login(&self.addr, "localhost", &tls, &self.user, &self.password, self.role)
                .await
                .map_err(|e| FsError::Setup(format!("logging in at the authentication server again: {e}")))?;
            Ok((grant.credential, grant.idkey))
        })
    }
}

#[track_caller]
fn auth_status<T>(r: Result<T, AuthError>) -> FsStatus {
    match r {
        Err(e) => e.status().unwrap_or_else(|| panic!("expected a refusal, got {e}")),
        Ok(_) => panic!("expected a refusal"),
    }
}

#[track_caller]
fn fs_status<T>(r: Result<T, FsError>) -> FsStatus {
    match r {
        Err(e) => e.status().unwrap_or_else(|| panic!("expected a refusal from the manager, got {e:?}")),
        Ok(_) => panic!("expected a refusal from the manager"),
    }
}

#[track_caller]
fn drive_status<T: std::fmt::Debug>(r: Result<T, ClientError>) -> Status {
    match r {
        Err(e) => e.status().unwrap_or_else(|| panic!("expected a refusal from the drive, got {e:?}")),
        Ok(v) => panic!("expected a refusal from the drive, got {v:?}"),
    }
}

fn identity_config(c: &Cluster, credential: IdentityData, idkey: Key) -> FsConfig {
    FsConfig { identity: Some((credential, idkey)), ..c.fs_config("", "") }
}

/// Logs in to the manager with an identity (and forged ones).
async fn manager_login(c: &Cluster, credential: IdentityData, idkey: &Key) -> Result<FsClient, FsError> {
    to(FsClient::connect(&identity_config(c, credential, idkey.clone()))).await
}

/// A client of drive number `drive` whose requests go under `auth`.
async fn drive_client(c: &Cluster, drive: u32, auth: Auth) -> DriveClient {
    let d = c.manager.drives().into_iter().find(|d| d.drive == drive).expect("a drive of the cluster");
    let mut client = DriveClient::connect(d.addr.as_str()).await.unwrap();
    client.set_auth(auth);
    client
}

/// A client of the first drive whose requests go under the identity alone.
async fn drive_as(c: &Cluster, credential: IdentityData, idkey: &Key) -> DriveClient {
    drive_as_on(c, c.manager.drives()[0].drive, credential, idkey).await
}

/// A client of drive number `drive` whose requests go under the identity alone.
async fn drive_as_on(c: &Cluster, drive: u32, credential: IdentityData, idkey: &Key) -> DriveClient {
    let protection = Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA);
    drive_client(c, drive, Auth::new(Credential::Identity { data: credential, key: idkey.clone() }, protection)).await
}

/// An authentication server and a cluster of `drives` drives whose
/// partition uses `scheme`, users A and B added, the identity keys and the
/// scheme on every drive, and a directory `/shared` anyone may write; with
/// the administrator's session. Every byte is on the drives (small-file
/// threshold 0): the tests using it are about what the drives' PALs allow
/// (bytes below the threshold go through the manager, which checks the ACL
/// itself).
async fn pal_cluster(scheme: AuthScheme, drives: usize) -> (Auth0, Cluster, FsClient) {
    pal_cluster_with(scheme, drives, |c| c).await
}

/// [`pal_cluster`] with the manager's configuration changed by `change`.
async fn pal_cluster_with(
    scheme: AuthScheme,
    drives: usize,
    change: impl FnOnce(ManagerConfig) -> ManagerConfig,
) -> (Auth0, Cluster, FsClient) {
    let auth = Auth0::start().await;
    let config = change(pal_config(&auth, scheme));
    let cluster = Cluster::start(ClusterOptions { config, drives, ..ClusterOptions::default() }).await;
    let admin = pal_setup(&auth, &cluster).await;
    (auth, cluster, admin)
}

/// [`pal_cluster`] with `default_layout`, whose `drives` drives are each
/// reached through a [`Proxy::recording`] relay (the drives and relays are
/// returned in order).
async fn recorded_pal_cluster(
    scheme: AuthScheme,
    drives: usize,
    default_layout: nasd_fs::Layout,
) -> (Auth0, Cluster, FsClient, Vec<(TestDrive, Proxy)>) {
    let auth = Auth0::start().await;
    let config = ManagerConfig { default_layout, ..pal_config(&auth, scheme) };
    let cluster = Cluster::start(ClusterOptions { config, drives: 0, ..ClusterOptions::default() }).await;
    let mut relayed = Vec::new();
    for i in 0..drives {
        let drive = TestDrive::start(cluster.dir().join(format!("drive-{i}"))).await;
        let proxy = Proxy::recording(drive.addr).await;
        to(cluster.manager.add_drive(&proxy.addr.to_string(), &drive.master)).await.expect("add a relayed drive");
        relayed.push((drive, proxy));
    }
    let admin = pal_setup(&auth, &cluster).await;
    (auth, cluster, admin, relayed)
}

/// Users A and B at the authentication server, the administrator's session
/// by identity, the identity keys and the scheme on every drive, and
/// `/shared`.
async fn pal_setup(auth: &Auth0, cluster: &Cluster) -> FsClient {
    let (mut root, root_grant) = auth.login(ROOT, ROOT_PW, 0).await.unwrap();
    to(root.add_user(USER_A, PW_A, UID_A, 0, false)).await.unwrap();
    to(root.add_user(USER_B, PW_B, UID_B, 0, false)).await.unwrap();
    // The manager takes identities only: the administrator is the authentication server's.
    let admin = manager_login(cluster, root_grant.credential, &root_grant.idkey).await.unwrap();
    // The keys and the partition's scheme reach the drives.
    to(admin.sync_identity_keys()).await.unwrap();
    to(admin.mkdir("/shared", 0o777)).await.unwrap();
    admin
}

/// The manager configuration of [`pal_cluster`].
fn pal_config(auth: &Auth0, scheme: AuthScheme) -> ManagerConfig {
    ManagerConfig {
        pool_target: 4,
        auth: Some(auth.link()),
        auth_scheme: scheme,
        small_file_threshold: 0,
        ..ManagerConfig::default()
    }
}

/// A client of the first drive under its drive key (what only the manager
/// holds): to change a PAL behind the manager's back, and to read one.
async fn drive_owner(c: &Cluster) -> DriveClient {
    drive_owner_of(c, c.manager.drives()[0].drive).await
}

/// A client of drive number `drive` under its drive key.
async fn drive_owner_of(c: &Cluster, drive: u32) -> DriveClient {
    let d = c.manager.drives().into_iter().find(|d| d.drive == drive).expect("a drive of the cluster");
    drive_client(c, drive, Auth::new(Credential::Drive(d.keys().drive.clone()), Protection::INTEGRITY_ARGS)).await
}

fn entry(who: nasd_fs::AclWho, rights: u8) -> nasd_fs::AclEntry {
    nasd_fs::AclEntry { who, rights, flags: 0 }
}

fn whole() -> [Region; 1] {
    [Region { offset: 0, length: DATA.len() as u64 }]
}

#[test]
fn identities_from_the_auth_server_at_manager_and_drives() {
    run(async {
        let auth = Auth0::start().await;
        let config = ManagerConfig { pool_target: 4, auth: Some(auth.link()), ..ManagerConfig::default() };
        let cluster = Cluster::start(ClusterOptions { config, drives: 2, ..ClusterOptions::default() }).await;
        let partition = cluster.manager.config().partition;

        // The administrator sets up users and roles at the authentication server.
        let (mut root, root_grant) = auth.login(ROOT, ROOT_PW, 0).await.unwrap();
        assert!(root_grant.admin);
        to(root.add_user(USER_A, PW_A, UID_A, 0, false)).await.unwrap();
        to(root.add_user(USER_B, PW_B, UID_B, 0, false)).await.unwrap();
        to(root.add_user(CAROL, PW_C, UID_C, 0, false)).await.unwrap();
        to(root.add_role(STAFF, "staff")).await.unwrap();
        to(root.add_role(AUDIT, "audit")).await.unwrap();
        to(root.set_user_role(USER_A, STAFF, true)).await.unwrap();
        to(root.set_user_role(USER_A, AUDIT, true)).await.unwrap();
        assert_eq!(auth_status(to(root.add_user(USER_A, PW_A, 4000, 0, false)).await), FsStatus::Exists);

        // Password login: the wrong password, a role not held, then the right ones.
        assert_eq!(auth_status(auth.login(USER_A, "not alice's password", 0).await), FsStatus::BadCredentials);
        assert_eq!(auth_status(auth.login("nobody", PW_A, 0).await), FsStatus::BadCredentials);
        assert_eq!(auth_status(auth.login(USER_B, PW_B, STAFF).await), FsStatus::NotPermitted, "bob is not staff");
        let (mut alice_auth, alice) = auth.login(USER_A, PW_A, STAFF).await.unwrap();
        assert_eq!((alice.uid, alice.roles.clone()), (UID_A, vec![STAFF, AUDIT]));
        assert_eq!((alice.credential.user, alice.credential.role, alice.credential.key_id), (UID_A, STAFF, 1));
        let alice_audit = auth.grant(USER_A, PW_A, AUDIT).await;
        assert_eq!(alice_audit.credential.role, AUDIT, "one role per session, the user's choice");
        // Administrator requests need an administrator.
        assert_eq!(auth_status(to(alice_auth.rotate_key()).await), FsStatus::NotAdmin);
        assert_eq!(auth_status(to(alice_auth.add_user("eve", "eve password", 666, 0, true)).await), FsStatus::NotAdmin);

        // Groups users make themselves: alice makes one and puts bob in it.
        let gid = to(alice_auth.create_group("project")).await.unwrap().gid;
        to(alice_auth.set_group_member(gid, USER_B, true)).await.unwrap();
        let (mut bob_auth, bob) = auth.login(USER_B, PW_B, 0).await.unwrap();
        assert_eq!(
            auth_status(to(bob_auth.set_group_member(gid, CAROL, true)).await),
            FsStatus::NotPermitted,
            "only the owner chooses members"
        );

        // Linked to the authentication server, the manager takes no passwords — not even the
        // right one of its own administrator — and says where to log in instead.
        let refused = to(FsClient::connect(&cluster.fs_config(ADMIN, ADMIN_PW))).await;
        let Err(said) = refused else { panic!("password login accepted") };
        assert_eq!(said.status(), Some(FsStatus::BadCredentials), "{said}");
        let said = said.to_string();
        assert!(said.contains("takes no passwords") && said.contains("nasd auth login"), "{said}");

        // The manager installs the shared keys on its drives; identities log in to it.
        let admin = manager_login(&cluster, root_grant.credential, &root_grant.idkey).await.unwrap();
        to(admin.sync_identity_keys()).await.unwrap();
        to(admin.mkdir("/shared", 0o777)).await.unwrap();
        let alice_fs = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();
        assert_eq!(alice_fs.identity().uid, UID_A);
        to(alice_fs.write_file("/shared/f", b"group data")).await.unwrap();
        let attr = to(alice_fs.chown("/shared/f", None, Some(gid))).await.expect("alice is in her group");
        assert_eq!((attr.uid, attr.gid), (UID_A, gid));
        to(alice_fs.chmod("/shared/f", 0o640)).await.unwrap();
        let bob_fs = manager_login(&cluster, bob.credential, &bob.idkey).await.unwrap();
        assert_eq!(to(bob_fs.read_file("/shared/f")).await.unwrap(), b"group data", "bob is in the group");
        let carol = auth.grant(CAROL, PW_C, 0).await;
        let carol_fs = manager_login(&cluster, carol.credential, &carol.idkey).await.unwrap();
        assert_eq!(fs_status(to(carol_fs.read_file("/shared/f")).await), FsStatus::PermissionDenied);

        // Forged and tampered identities at the manager.
        let mut as_bob = alice.credential;
        as_bob.user = UID_B;
        assert_eq!(fs_status(manager_login(&cluster, as_bob, &alice.idkey).await), FsStatus::BadCredentials);
        let mut longer = alice.credential;
        longer.expiration_ns += 1;
        assert_eq!(fs_status(manager_login(&cluster, longer, &alice.idkey).await), FsStatus::BadCredentials);
        // Key id 0, which no shared key has: a tampered field like any other, not a malformed request.
        let key_0 = IdentityData { key_id: 0, ..alice.credential };
        assert_eq!(fs_status(manager_login(&cluster, key_0, &alice.idkey).await), FsStatus::BadCredentials);
        assert_eq!(
            fs_status(manager_login(&cluster, alice.credential, &Key::random()).await),
            FsStatus::BadCredentials
        );
        // An expired identity key (made with the real K, as the server would with a short lifetime).
        let (_, keys) = auth.server.shared_keys().await.unwrap();
        let k1 = Key::from_bytes(keys[0].key);
        let expired = IdentityData { expiration_ns: 1, ..alice.credential };
        let expired_key = identity_key(&k1, &expired).unwrap();
        assert_eq!(fs_status(manager_login(&cluster, expired, &expired_key).await), FsStatus::NotLoggedIn);
        // The proof is not the identity key: a proof seen by the manager does not MAC drive requests.
        assert_ne!(identity_login_proof(&alice.idkey, &alice.credential).unwrap(), *alice.idkey.expose());

        // The drive: an object whose PAL lets alice (and role audit) read.
        let mut owner = drive_owner(&cluster).await;
        to(owner.set_auth_scheme(partition, AuthScheme::BOTH)).await.unwrap();
        let (object, _) = to(owner.create(partition)).await.unwrap();
        to(owner.write(partition, object, &whole(), DATA)).await.unwrap();
        let read = rights::READ | rights::GETATTR;
        let entries = vec![
            PalEntry { principal: Principal::User(UID_A), rights: read },
            PalEntry { principal: Principal::Role(AUDIT), rights: read },
        ];
        to(owner.set_pal(partition, object, &ObjectPal { collection: 0, pal: Pal::new(entries) })).await.unwrap();

        let mut a = drive_as(&cluster, alice.credential, &alice.idkey).await;
        assert_eq!(to(a.read(partition, object, &whole())).await.unwrap().1, DATA);
        let mut b = drive_as(&cluster, bob.credential, &bob.idkey).await;
        assert_eq!(drive_status(to(b.read(partition, object, &whole())).await), Status::NotInPal);
        // Tampered: bob's credential claiming role audit, MACed with bob's real identity key.
        let bob_audit = IdentityData { role: AUDIT, ..bob.credential };
        let mut b = drive_as(&cluster, bob_audit, &bob.idkey).await;
        assert_eq!(drive_status(to(b.read(partition, object, &whole())).await), Status::BadDigest);
        let mut e = drive_as(&cluster, expired, &expired_key).await;
        assert_eq!(drive_status(to(e.read(partition, object, &whole())).await), Status::IdentityExpired);

        // Rotation: key 2 for new logins; alice's key-1 identity keeps working everywhere.
        assert_eq!(to(root.rotate_key()).await.unwrap(), 2);
        // No one asks: the manager's maintenance pass installs it.
        to(cluster.manager.maintain()).await;
        let alice2 = auth.grant(USER_A, PW_A, 0).await;
        assert_eq!(alice2.credential.key_id, 2);
        let mut a2 = drive_as(&cluster, alice2.credential, &alice2.idkey).await;
        assert_eq!(to(a2.read(partition, object, &whole())).await.unwrap().1, DATA);
        assert_eq!(to(a.read(partition, object, &whole())).await.unwrap().1, DATA, "key 1 still live");
        manager_login(&cluster, alice.credential, &alice.idkey).await.expect("key 1 still live at the manager");
        // The administrator's own session is by identity too: a key-2 one outlives key 1.
        let root2 = auth.grant(ROOT, ROOT_PW, 0).await;
        let admin = manager_login(&cluster, root2.credential, &root2.idkey).await.unwrap();

        // Retirement of key 1: the manager refuses new logins with it at once, its
        // open sessions at their next request, and the drives once synchronized.
        to(root.retire_key(1)).await.unwrap();
        assert_eq!(fs_status(manager_login(&cluster, alice.credential, &alice.idkey).await), FsStatus::BadCredentials);
        to(admin.sync_identity_keys()).await.unwrap();
        assert_eq!(fs_status(to(alice_fs.read_file("/shared/f")).await), FsStatus::NotLoggedIn);
        let mut a = drive_as(&cluster, alice.credential, &alice.idkey).await;
        assert_eq!(drive_status(to(a.read(partition, object, &whole())).await), Status::KeyVersionRetired);
        assert_eq!(to(a2.read(partition, object, &whole())).await.unwrap().1, DATA, "key 2 unaffected");
        assert_eq!(auth_status(to(root.retire_key(3)).await), FsStatus::InvalidArgument, "never made");

        // A disabled user: no login at the authentication server, none at the manager
        // with an identity key still in hand.
        to(root.set_user_enabled(USER_A, false)).await.unwrap();
        assert_eq!(auth_status(auth.login(USER_A, PW_A, 0).await), FsStatus::NotPermitted);
        assert_eq!(fs_status(manager_login(&cluster, alice2.credential, &alice2.idkey).await), FsStatus::NotPermitted);
        assert_eq!(
            auth_status(to(alice_auth.create_group("another")).await),
            FsStatus::NotLoggedIn,
            "her session ends"
        );
        to(root.set_user_enabled(USER_A, true)).await.unwrap();
        manager_login(&cluster, alice2.credential, &alice2.idkey).await.expect("enabled again");

        // The service requests are the manager's alone.
        assert_eq!(auth_status(to(root.identity_keys()).await), FsStatus::NotPermitted);

        drop((alice_fs, bob_fs, carol_fs, admin, a, a2, owner));
        auth.halt();
        cluster.stop().await;
    });
}

/// A user may own `GROUPS_OWNED_MAX` groups: creating one is refused
/// (`NO_SPACE`) only past that. Each makes its owner a member while the
/// owner is in fewer than `GROUPS_MAX` groups (the membership every session
/// carries); past that the owner owns the group without being in it, and
/// may still choose its members — itself too, once it left another group.
/// Creating used to be refused as soon as the owner was in `GROUPS_MAX`
/// groups, so no one owned more than 32.
#[test]
fn a_user_owns_up_to_groups_owned_max_groups() {
    use nasd_auth::store::GROUPS_OWNED_MAX;
    use nasd_fs::GROUPS_MAX;
    run(async {
        let auth = Auth0::start().await;
        let config = ManagerConfig { pool_target: 4, auth: Some(auth.link()), ..ManagerConfig::default() };
        let cluster = Cluster::start(ClusterOptions { config, drives: 1, ..ClusterOptions::default() }).await;
        let (mut root, root_grant) = auth.login(ROOT, ROOT_PW, 0).await.unwrap();
        to(root.add_user(USER_A, PW_A, UID_A, 0, false)).await.unwrap();
        to(root.add_user(USER_B, PW_B, UID_B, 0, false)).await.unwrap();
        let (mut alice, _) = auth.login(USER_A, PW_A, 0).await.unwrap();
        let mut owned = Vec::new();
        for i in 0..GROUPS_OWNED_MAX {
            let group = to(alice.create_group(&format!("g{i}"))).await.unwrap_or_else(|e| panic!("group {i}: {e}"));
            assert_eq!(group.member, i < GROUPS_MAX, "group {i}: a member while in fewer than GROUPS_MAX");
            owned.push(group.gid);
        }
        assert_eq!(auth_status(to(alice.create_group("one too many")).await), FsStatus::NoSpace);

        // She chooses the members of a group she owns and is not in, herself only once she has room.
        let last = *owned.last().unwrap();
        to(alice.set_group_member(last, USER_B, true)).await.unwrap();
        assert_eq!(auth_status(to(alice.set_group_member(last, USER_A, true)).await), FsStatus::NoSpace);
        to(alice.set_group_member(owned[0], USER_A, false)).await.unwrap();
        to(alice.set_group_member(last, USER_A, true)).await.unwrap();

        // Her sessions carry her GROUPS_MAX groups: the manager takes her identity, and she gives
        // a file to the group she joined last.
        let admin = manager_login(&cluster, root_grant.credential, &root_grant.idkey).await.unwrap();
        to(admin.mkdir("/shared", 0o777)).await.unwrap();
        let grant = auth.grant(USER_A, PW_A, 0).await;
        let alice_fs = manager_login(&cluster, grant.credential, &grant.idkey).await.expect("alice in 32 groups");
        to(alice_fs.write_file("/shared/f", b"for the last group")).await.unwrap();
        let attr = to(alice_fs.chown("/shared/f", None, Some(last))).await.expect("she is in it now");
        assert_eq!(attr.gid, last);
        assert_eq!(
            fs_status(to(alice_fs.chown("/shared/f", None, Some(owned[0]))).await),
            FsStatus::NotPermitted,
            "she left the first"
        );

        drop((alice_fs, admin));
        auth.halt();
        cluster.stop().await;
    });
}

/// After a burst of password guesses from one host at the authentication
/// server — dozens of connections, most still waiting for a turn when
/// their `AUTH_LOGIN_TIMEOUT` closes them — the host's right password logs
/// in once the guessing connections are gone. Turns used to be booked when
/// an attempt arrived and never handed back by one that timed out waiting:
/// after a 40 s burst the right password was turned away for about two
/// minutes. The burst's size and timing come from a printed seed.
#[test]
fn the_right_password_logs_in_once_a_guessing_burst_is_over() {
    run(async {
        let seed = guessing::burst_seed();
        let auth = Arc::new(Auth0::start().await);
        for i in 0..guessing::WARM_UP_FAILURES {
            assert_eq!(auth_status(auth.login(ROOT, &format!("warm-up {i}"), 0).await), FsStatus::BadCredentials);
        }
        let guessing_at = auth.clone();
        guessing::guessing_burst(seed, move |i| {
            let auth = guessing_at.clone();
            async move {
                // One guess per connection: refused, or closed unchecked at AUTH_LOGIN_TIMEOUT.
                match auth.login(ROOT, &format!("guess {i}"), 0).await {
                    Err(AuthError::Refused { status: FsStatus::BadCredentials, .. }) | Err(AuthError::Io(_)) => {}
                    other => panic!("a guess got {:?}", other.map(|_| "logged in")),
                }
            }
        })
        .await;
        let (_, grant) = auth.login(ROOT, ROOT_PW, 0).await.expect("the right password, once the guessing stopped");
        assert!(grant.admin);
        auth.halt();
    });
}

/// The authentication server keeps users, roles, groups and shared keys
/// (retired ones retired) across a restart, and bounds what an anonymous
/// peer can send.
#[test]
fn auth_server_restarts_and_bounds_anonymous_input() {
    run(async {
        use nasd_login::auth_client::{read_frame, write_frame};
        use nasd_proto::auth::{AuthReply, AuthRequest, AUTH_LOGIN_MESSAGE_MAX, AUTH_MESSAGE_MAX};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth");
        let (token, gid) = {
            let server = AuthServer::open(&path, AuthConfig::default()).unwrap();
            assert!(to(server.bootstrap_admin(ROOT, ROOT_PW, 0)).await.unwrap());
            to(server.add_user(USER_A, PW_A, UID_A, 0, false)).await.unwrap();
            to(server.add_role(STAFF, "staff")).await.unwrap();
            to(server.set_user_role(USER_A, STAFF, true)).await.unwrap();
            assert_eq!(to(server.rotate_key()).await.unwrap(), 2);
            assert_eq!(to(server.rotate_key()).await.unwrap(), 3);
            to(server.retire_key(2)).await.unwrap();
            let gid = match to(
                server.handle(nasd_auth::Principal::User(UID_A), AuthRequest::CreateGroup { name: "p".into() })
            )
            .await
            .unwrap()
            {
                AuthReply::Group { gid, member: true } => gid,
                other => panic!("{other:?}"),
            };
            (server.service_token().clone(), gid)
        };
        let server = Arc::new(AuthServer::open(&path, AuthConfig::default()).unwrap());
        assert!(!to(server.bootstrap_admin(ROOT, "another password", 0)).await.unwrap(), "the administrator exists");
        assert_eq!(server.service_token(), &token);
        let (high, keys) = server.shared_keys().await.unwrap();
        assert_eq!((high, keys.iter().map(|k| k.key_id).collect::<Vec<_>>()), (3, vec![1, 3]), "2 stays retired");
        let alice = to(server.user(UID_A)).await.unwrap().unwrap();
        assert_eq!((alice.roles, alice.groups), (vec![STAFF], vec![gid]));
        match to(server.login(USER_A, PW_A, STAFF)).await.unwrap() {
            AuthReply::LoggedIn { credential, .. } => assert_eq!(credential.key_id, 3, "the newest live key"),
            other => panic!("{other:?}"),
        }

        // Over TLS: a message before login longer than AUTH_LOGIN_MESSAGE_MAX is answered
        // BAD_REQUEST unread and the connection closed; an unknown opcode is BAD_REQUEST.
        let names = vec!["localhost".to_string()];
        let files = nasd_login::tls::ensure_certificates(&dir.path().join("tls"), &names).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, rx) = watch::channel(false);
        tokio::spawn(server.clone().serve(listener, nasd_login::tls::acceptor(&files).unwrap(), rx));
        let tls = nasd_login::auth_client::connector(&files.ca).unwrap();
        let connect = || async {
            let socket = tokio::net::TcpStream::connect(addr).await.unwrap();
            tls.connect(rustls::pki_types::ServerName::try_from("localhost").unwrap(), socket).await.unwrap()
        };
        let mut s = to(connect()).await;
        let big = vec![0u8; AUTH_LOGIN_MESSAGE_MAX + 1];
        to(write_frame(&mut s, &big)).await.unwrap();
        let reply = to(read_frame(&mut s, AUTH_MESSAGE_MAX)).await.unwrap().expect("a reply");
        assert_eq!(AuthReply::decode(&reply).unwrap().1.unwrap_err().0, FsStatus::BadRequest);
        assert!(to(read_frame(&mut s, AUTH_MESSAGE_MAX)).await.map_or(true, |b| b.is_none()), "closed");
        let mut s = to(connect()).await;
        let mut junk = vec![0x77, 0x77];
        junk.extend_from_slice(&9u64.to_le_bytes());
        to(write_frame(&mut s, &junk)).await.unwrap();
        let reply = to(read_frame(&mut s, AUTH_MESSAGE_MAX)).await.unwrap().expect("a reply");
        let (id, outcome) = AuthReply::decode(&reply).unwrap();
        assert_eq!((id, outcome.unwrap_err().0), (9, FsStatus::BadRequest));
        // Requests other than a login, before one: NOT_LOGGED_IN.
        to(write_frame(&mut s, &AuthRequest::IdentityKeys.encode(10))).await.unwrap();
        let reply = to(read_frame(&mut s, AUTH_MESSAGE_MAX)).await.unwrap().expect("a reply");
        assert_eq!(AuthReply::decode(&reply).unwrap().1.unwrap_err().0, FsStatus::NotLoggedIn);
        // A wrong service token.
        let wrong = AuthRequest::ServiceLogin { version: 1, token: [0; 32] };
        to(write_frame(&mut s, &wrong.encode(11))).await.unwrap();
        let reply = to(read_frame(&mut s, AUTH_MESSAGE_MAX)).await.unwrap().expect("a reply");
        assert_eq!(AuthReply::decode(&reply).unwrap().1.unwrap_err().0, FsStatus::BadCredentials);
        let _ = stop.send(true);
    });
}

/// The manager flattens each file's ACL into the access PAL of its
/// component objects and pushes it on create and on every ACL, mode or
/// owner change before answering: a drive then authorizes requests by
/// identity alone, with the rights the ACL gives now — not those of a
/// stale PAL.
#[test]
fn pals_follow_acls_and_modes() {
    run(async {
        let (auth, mut cluster, admin) = pal_cluster(AuthScheme::BOTH, 1).await;
        let partition = cluster.manager.config().partition;
        let (alice, bob) = (auth.grant(USER_A, PW_A, 0).await, auth.grant(USER_B, PW_B, 0).await);
        let alice_fs = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();

        // Created: the owner's PAL entry is on the object before CREATE answers.
        let minted = cluster.manager.capabilities_minted();
        to(alice_fs.write_file("/shared/f", DATA)).await.unwrap();
        assert!(cluster.manager.capabilities_minted() > minted, "a partition that takes both still gets capabilities");
        to(alice_fs.chmod("/shared/f", 0o600)).await.unwrap();
        let layout = to(admin.get_layout("/shared/f")).await.unwrap();
        let object = layout.components[0].0.object.object;
        let mut a = drive_as(&cluster, alice.credential, &alice.idkey).await;
        assert_eq!(to(a.read(partition, object, &whole())).await.unwrap().1, DATA, "no capability asked for");
        let mut b = drive_as(&cluster, bob.credential, &bob.idkey).await;
        assert_eq!(drive_status(to(b.read(partition, object, &whole())).await), Status::NotInPal, "bob is absent");

        // Alice grants bob read: his identity reads from the drive, and still cannot write.
        to(alice_fs.set_acl(
            "/shared/f",
            vec![nasd_fs::AclEntry { who: nasd_fs::AclWho::User(UID_B), rights: nasd_fs::ACL_READ, flags: 0 }],
        ))
        .await
        .unwrap();
        assert_eq!(to(b.read(partition, object, &whole())).await.unwrap().1, DATA);
        assert_eq!(drive_status(to(b.write(partition, object, &whole(), DATA)).await), Status::RightsInsufficient);

        // Stale-PAL attack: the moment chmod returns, the old owner rights are gone on the drive.
        to(alice_fs.chmod("/shared/f", 0o200)).await.unwrap();
        assert_eq!(drive_status(to(a.read(partition, object, &whole())).await), Status::RightsInsufficient);
        to(a.write(partition, object, &whole(), DATA)).await.expect("w is still the owner's");
        to(alice_fs.chmod("/shared/f", 0o000)).await.unwrap();
        assert_eq!(drive_status(to(a.read(partition, object, &whole())).await), Status::NotInPal);
        // ... and the moment SET_ACL returns, bob's.
        to(alice_fs.set_acl("/shared/f", Vec::new())).await.unwrap();
        assert_eq!(drive_status(to(b.read(partition, object, &whole())).await), Status::NotInPal);

        // Overflow: the owner and PAL_ENTRIES_MAX named users do not fit one PAL: refused, nothing changed.
        let many: Vec<_> = (0..nasd_proto::limits::PAL_ENTRIES_MAX as u32)
            .map(|i| nasd_fs::AclEntry { who: nasd_fs::AclWho::User(5000 + i), rights: nasd_fs::ACL_READ, flags: 0 })
            .collect();
        assert_eq!(fs_status(to(alice_fs.set_acl("/shared/f", many.clone())).await), FsStatus::TooBig);
        assert!(to(alice_fs.get_acl("/shared/f")).await.unwrap().entries.is_empty());
        to(alice_fs.set_acl("/shared/f", many[1..].to_vec())).await.expect("the owner and 31 users fit");

        // A gateway (its grant is the manager's, in its record of alice) acts for bob by identity
        // here: the manager mints capabilities for bob, which the drives take beside PALs. Alice's
        // session, open before the grant, takes it at its next request.
        let early = alice_fs.as_user(UID_B, UID_B, &[]).unwrap();
        assert_eq!(fs_status(to(early.stat("/shared")).await), FsStatus::NotPermitted, "no grant yet");
        to(admin.set_gateway(USER_A, Some((UID_A, UID_B)))).await.unwrap();
        to(early.stat("/shared")).await.expect("the grant reaches the open identity session");
        let gateway = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();
        let for_bob = gateway.as_user(UID_B, UID_B, &[]).unwrap();
        to(for_bob.write_file("/shared/by-gateway", DATA)).await.expect("bob's write through the gateway");
        assert_eq!(to(admin.stat("/shared/by-gateway")).await.unwrap().attr.uid, UID_B, "made as bob");
        assert_eq!(to(for_bob.read_file("/shared/by-gateway")).await.unwrap(), DATA);
        drop((gateway, for_bob, early));

        // A drive that misses the push: the chmod is committed and reported, and the PAL is set
        // again at the maintenance pass after the drive is back.
        drop((a, b));
        let stopped = cluster.drives.remove(0).halt().await;
        assert_eq!(fs_status(to(alice_fs.chmod("/shared/f", 0o600)).await), FsStatus::DriveUnavailable);
        cluster.drives.insert(0, stopped.start().await);
        let mut a = drive_as(&cluster, alice.credential, &alice.idkey).await;
        assert_eq!(drive_status(to(a.read(partition, object, &whole())).await), Status::NotInPal, "still the old PAL");
        to(cluster.manager.maintain()).await;
        assert_eq!(to(a.read(partition, object, &whole())).await.unwrap().1, DATA, "the PAL of mode 0600");

        drop((alice_fs, admin, a));
        auth.halt();
        cluster.stop().await;
    });
}

/// On a partition that accepts PALs only, the manager's open replies carry
/// the layout and bindings but mint no capability, and the file-system
/// client reads and writes with the session's identity
/// (`DrivePool::with_identity`) without noticing: each byte below went
/// under an identity checked against the PAL the manager pushed. A gateway
/// acting for other users is refused there.
#[test]
fn the_client_uses_its_identity_on_a_pal_partition() {
    run(async {
        let (auth, cluster, admin) = pal_cluster(AuthScheme::PALS, 2).await;
        let (alice, bob) = (auth.grant(USER_A, PW_A, 0).await, auth.grant(USER_B, PW_B, 0).await);
        let alice_fs = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();
        let bob_fs = manager_login(&cluster, bob.credential, &bob.idkey).await.unwrap();

        to(alice_fs.write_file("/shared/f", DATA)).await.unwrap();
        to(alice_fs.chmod("/shared/f", 0o600)).await.unwrap();
        assert_eq!(to(alice_fs.read_file("/shared/f")).await.unwrap(), DATA);
        // The open reply carries the layout and each component's binding, and no capability:
        // the drives would refuse one here, so the manager mints none.
        let e = to(alice_fs.walk("/shared/f", nasd_fs::OpenMode::ReadWrite)).await.unwrap();
        let access = e.access.expect("an open file's access");
        assert_eq!(access.components.len(), access.layout.components());
        assert!(access.components.iter().all(|c| c.token.is_empty() && c.key == [0; 32]), "no capability minted");
        assert_ne!(access.rights, 0, "the rights the ACL gives are still said");
        // A gateway acting for other users would need capabilities for them: refused, saying what to set.
        let for_bob = alice_fs.as_user(UID_B, UID_B, &[]).unwrap();
        let refused = to(for_bob.stat("/shared")).await;
        let Err(said) = refused else { panic!("AS_USER accepted on a PALs-only partition") };
        assert_eq!(said.status(), Some(FsStatus::NotSupported), "{said}");
        let said = said.to_string();
        assert!(said.contains("auth_scheme = \"both\""), "{said}");
        // Bob: refused by the manager, then granted read through the ACL.
        assert_eq!(fs_status(to(bob_fs.read_file("/shared/f")).await), FsStatus::PermissionDenied);
        let read = nasd_fs::AclEntry { who: nasd_fs::AclWho::User(UID_B), rights: nasd_fs::ACL_READ, flags: 0 };
        to(alice_fs.set_acl("/shared/f", vec![read])).await.unwrap();
        assert_eq!(to(bob_fs.read_file("/shared/f")).await.unwrap(), DATA);
        // Alice rewrites it by identity; bob reads the new bytes.
        to(alice_fs.write_file("/shared/f", b"second version")).await.unwrap();
        assert_eq!(to(bob_fs.read_file("/shared/f")).await.unwrap(), b"second version");
        // An empty file re-placed on new components (SET_LAYOUT) carries its PAL there too.
        to(alice_fs.write_file("/shared/e", b"")).await.unwrap();
        let two = nasd_fs::Layout::parse("stripe:2@64K").unwrap();
        to(alice_fs.set_layout("/shared/e", Some(two))).await.unwrap();
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        to(alice_fs.write_file("/shared/e", &big)).await.unwrap();
        assert_eq!(to(alice_fs.read_file("/shared/e")).await.unwrap(), big, "both components by identity");
        assert_eq!(cluster.manager.capabilities_minted(), 0, "every byte above moved with no capability minted");

        drop((alice_fs, bob_fs, admin));
        auth.halt();
        cluster.stop().await;
    });
}

/// Sends `frame` to the drive at `addr` on a new connection and returns the
/// status of its reply (whose data, if any, is left unread).
async fn send_once(addr: std::net::SocketAddr, frame: &[u8]) -> Status {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = to(tokio::net::TcpStream::connect(addr)).await.unwrap();
    to(sock.write_all(frame)).await.unwrap();
    let mut head = [0u8; nasd_proto::limits::HEADER_LEN];
    to(sock.read_exact(&mut head)).await.unwrap();
    Status::from_code(nasd_proto::FrameHeader::decode(&head).unwrap().status).unwrap()
}

/// Issue 22, end to end: a man in the middle with no key captures every
/// request alice's file writes send each drive (and the manager's own) and
/// replays each, unchanged and within the drives' replay window, to every
/// other drive — where object numbers repeat and alice may write the same
/// object numbers. Every one is refused by its digest, and every file reads
/// back as written (before identity requests were bound to their drive, a
/// replayed write landed in another file's component).
#[test]
fn requests_captured_on_one_drive_are_refused_by_every_other_drive() {
    run(async {
        let rs = nasd_fs::Layout::parse("rs:2+1").unwrap();
        for scheme in [AuthScheme::PALS, AuthScheme::BOTH] {
            let (auth, cluster, admin, drives) = recorded_pal_cluster(scheme, 3, rs).await;
            let alice = auth.grant(USER_A, PW_A, 0).await;
            let alice_fs = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();
            let mut files = Vec::new();
            let mut replayed = std::collections::HashSet::new();
            for i in 0..4u64 {
                let (path, data) = (format!("/shared/r{i}"), pattern(i, 150_000 + 10_000 * i as usize));
                to(alice_fs.write_file(&path, &data)).await.unwrap();
                files.push((path, data));
                for (from, (_, proxy)) in drives.iter().enumerate() {
                    for frame in proxy.request_frames() {
                        let key_type = frame[16];
                        if key_type == nasd_proto::KeyType::None as u8 || !replayed.insert(frame.clone()) {
                            continue; // HELLO and INQUIRY prove nothing; each frame once
                        }
                        for (other, (d, _)) in drives.iter().enumerate().filter(|(j, _)| *j != from) {
                            let opcode = u16::from_le_bytes([frame[6], frame[7]]);
                            assert_eq!(
                                send_once(d.addr, &frame).await,
                                Status::BadDigest,
                                "{scheme:?}: opcode {opcode:#06x} under key type {key_type} for drive {from} \
                                 replayed to drive {other}"
                            );
                        }
                    }
                }
            }
            let identity_frames = replayed.iter().filter(|f| f[16] == nasd_proto::KeyType::Identity as u8).count();
            assert!(identity_frames > 0, "{scheme:?}: alice's writes went by identity");
            for (path, data) in &files {
                assert_eq!(&to(alice_fs.read_file(path)).await.unwrap(), data, "{scheme:?}: {path}");
            }
            drop((alice_fs, admin));
            auth.halt();
            cluster.stop().await;
            for (drive, proxy) in drives {
                drop(proxy);
                drive.stop().await;
            }
        }
    });
}

/// A drive taken out of service and then cut off is passed by when the
/// identity keys are synchronized: the synchronizations after a rotation
/// and a retirement succeed (before, each failed naming that drive, as
/// every maintenance pass did), and the drives in service have the new key
/// (alice's key-2 identity writes and reads there). Back in service and
/// answering, the drive is brought up to date by the next synchronization.
#[test]
fn a_drive_out_of_service_and_cut_off_is_passed_by_when_identity_keys_are_synchronized() {
    run(async {
        let one = nasd_fs::Layout::parse("stripe:1").unwrap();
        let (auth, cluster, admin, drives) = recorded_pal_cluster(AuthScheme::PALS, 3, one).await;
        let (_, proxy) = &drives[2];
        let status = to(admin.cluster_status()).await.unwrap();
        let out = status.drives.iter().find(|d| d.addr == proxy.addr.to_string()).expect("the relayed drive").drive;
        to(admin.set_drive_state(out, nasd_fs::DriveState::Out)).await.unwrap();
        proxy.cut();

        let (mut root, _) = auth.login(ROOT, ROOT_PW, 0).await.unwrap();
        assert_eq!(to(root.rotate_key()).await.unwrap(), 2);
        to(admin.sync_identity_keys()).await.expect("the drive out of service is passed by");
        to(admin.sync_identity_keys()).await.expect("and again");
        let alice = auth.grant(USER_A, PW_A, 0).await;
        assert_eq!(alice.credential.key_id, 2);
        let alice_fs = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();
        for i in 0..4u64 {
            let (path, data) = (format!("/shared/k{i}"), pattern(i, 50_000));
            to(alice_fs.write_file(&path, &data)).await.unwrap();
            assert_eq!(to(alice_fs.read_file(&path)).await.unwrap(), data, "{path} under key 2");
        }
        // The administrator's key-1 session ends with key 1: a key-2 one goes on.
        let root2 = auth.grant(ROOT, ROOT_PW, 0).await;
        let admin2 = manager_login(&cluster, root2.credential, &root2.idkey).await.unwrap();
        to(root.retire_key(1)).await.unwrap();
        to(admin2.sync_identity_keys()).await.expect("the retirement's synchronization passes it by too");

        proxy.reconnect();
        to(admin2.set_drive_state(out, nasd_fs::DriveState::In)).await.unwrap();
        to(admin2.sync_identity_keys()).await.expect("back in service, the drive is brought up to date");
        drop((alice_fs, admin, admin2));
        auth.halt();
        cluster.stop().await;
        for (drive, proxy) in drives {
            drop(proxy);
            drive.stop().await;
        }
    });
}

/// Role entries of the ACL (`role:N`): the manager grants them to a session
/// whose identity credential carries the role, and flattens them into PAL
/// role entries, so a drive grants them by the credential alone. A role the
/// user does not hold is no way in: the authentication server does not
/// issue it, a credential claiming it does not verify, and one whose role
/// was taken away is refused at the manager.
#[test]
fn role_entries_reach_the_drives() {
    run(async {
        let (auth, cluster, admin) = pal_cluster(AuthScheme::PALS, 1).await;
        let partition = cluster.manager.config().partition;
        let (mut root, _) = auth.login(ROOT, ROOT_PW, 0).await.unwrap();
        to(root.add_role(STAFF, "staff")).await.unwrap();
        to(root.set_user_role(USER_B, STAFF, true)).await.unwrap();
        to(root.add_user(CAROL, PW_C, UID_C, 0, false)).await.unwrap();
        let alice = auth.grant(USER_A, PW_A, 0).await;
        let (bob_staff, bob_plain) = (auth.grant(USER_B, PW_B, STAFF).await, auth.grant(USER_B, PW_B, 0).await);
        let alice_fs = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();
        let staff_fs = manager_login(&cluster, bob_staff.credential, &bob_staff.idkey).await.unwrap();
        let plain_fs = manager_login(&cluster, bob_plain.credential, &bob_plain.idkey).await.unwrap();

        to(alice_fs.write_file("/shared/f", DATA)).await.unwrap();
        to(alice_fs.chmod("/shared/f", 0o600)).await.unwrap();
        assert_eq!(fs_status(to(staff_fs.read_file("/shared/f")).await), FsStatus::PermissionDenied);
        to(alice_fs.set_acl("/shared/f", vec![entry(nasd_fs::AclWho::Role(STAFF), nasd_fs::ACL_READ)])).await.unwrap();
        assert_eq!(
            to(alice_fs.get_acl("/shared/f")).await.unwrap().entries,
            vec![entry(nasd_fs::AclWho::Role(STAFF), nasd_fs::ACL_READ)]
        );
        // Through the file system (the manager's ACL check, then the drive's PAL by role) ...
        assert_eq!(to(staff_fs.read_file("/shared/f")).await.unwrap(), DATA, "bob acting as staff");
        assert_eq!(fs_status(to(plain_fs.read_file("/shared/f")).await), FsStatus::PermissionDenied, "bob, no role");
        // ... and at the drive alone: the PAL names the role.
        let object = to(admin.get_layout("/shared/f")).await.unwrap().components[0].0.object.object;
        let pal = to(drive_owner(&cluster).await.get_pal(partition, object)).await.unwrap();
        assert_eq!(pal.pal.rights_for(UID_B, STAFF), Some(rights::READ | rights::GETATTR));
        let mut staff = drive_as(&cluster, bob_staff.credential, &bob_staff.idkey).await;
        assert_eq!(to(staff.read(partition, object, &whole())).await.unwrap().1, DATA);
        assert_eq!(drive_status(to(staff.write(partition, object, &whole(), DATA)).await), Status::RightsInsufficient);
        let mut plain = drive_as(&cluster, bob_plain.credential, &bob_plain.idkey).await;
        assert_eq!(drive_status(to(plain.read(partition, object, &whole())).await), Status::NotInPal);

        // A role the user does not hold: not issued, not forgeable.
        assert_eq!(auth_status(auth.login(CAROL, PW_C, STAFF).await), FsStatus::NotPermitted);
        let carol = auth.grant(CAROL, PW_C, 0).await;
        let claimed = IdentityData { role: STAFF, ..carol.credential };
        let mut c = drive_as(&cluster, claimed, &carol.idkey).await;
        assert_eq!(drive_status(to(c.read(partition, object, &whole())).await), Status::BadDigest);
        assert_eq!(fs_status(manager_login(&cluster, claimed, &carol.idkey).await), FsStatus::BadCredentials);
        // The role taken away: the manager refuses the credential that still carries it.
        to(root.set_user_role(USER_B, STAFF, false)).await.unwrap();
        assert_eq!(
            fs_status(manager_login(&cluster, bob_staff.credential, &bob_staff.idkey).await),
            FsStatus::NotPermitted
        );
        manager_login(&cluster, bob_plain.credential, &bob_plain.idkey).await.expect("no role, still bob");

        // Overflow counts roles: the owner, 31 users and a role are 33 PAL entries.
        let mut many: Vec<_> = (0..nasd_proto::limits::PAL_ENTRIES_MAX as u32 - 1)
            .map(|i| entry(nasd_fs::AclWho::User(5000 + i), nasd_fs::ACL_READ))
            .collect();
        many.push(entry(nasd_fs::AclWho::Role(STAFF), nasd_fs::ACL_READ));
        assert_eq!(fs_status(to(alice_fs.set_acl("/shared/f", many.clone())).await), FsStatus::TooBig);
        many.remove(0);
        to(alice_fs.set_acl("/shared/f", many)).await.expect("the owner, 30 users and a role fit");

        drop((alice_fs, staff_fs, plain_fs, admin, staff, plain, c, root));
        auth.halt();
        cluster.stop().await;
    });
}

/// A PAL push a drive missed is recorded in the manager's metadata store,
/// not its memory: the manager restarts, the drive comes back, and the next
/// maintenance pass sets the PAL of the mode chmod gave — the old rights
/// are refused from then on.
#[test]
fn a_missed_pal_push_survives_a_manager_restart() {
    run(async {
        let (auth, mut cluster, admin) = pal_cluster(AuthScheme::PALS, 1).await;
        let partition = cluster.manager.config().partition;
        let alice = auth.grant(USER_A, PW_A, 0).await;
        let alice_fs = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();
        to(alice_fs.write_file("/shared/f", DATA)).await.unwrap();
        to(alice_fs.chmod("/shared/f", 0o600)).await.unwrap();
        let object = to(admin.get_layout("/shared/f")).await.unwrap().components[0].0.object.object;

        let stopped = cluster.drives.remove(0).halt().await;
        assert_eq!(fs_status(to(alice_fs.chmod("/shared/f", 0o200)).await), FsStatus::DriveUnavailable);
        drop((alice_fs, admin));
        cluster.restart_manager(pal_config(&auth, AuthScheme::PALS), false).await;
        cluster.drives.insert(0, stopped.start().await);
        let mut a = drive_as(&cluster, alice.credential, &alice.idkey).await;
        assert_eq!(to(a.read(partition, object, &whole())).await.unwrap().1, DATA, "the drive still has 0600's PAL");

        // The restarted manager's maintenance pass sets the PAL of mode 0200 from its store.
        to(cluster.manager.maintain()).await;
        assert_eq!(drive_status(to(a.read(partition, object, &whole())).await), Status::RightsInsufficient);
        to(a.write(partition, object, &whole(), DATA)).await.expect("write is still alice's");
        // Delivered: the record is cleared; an alteration behind the manager's back stays until asked.
        let mut owner = drive_owner(&cluster).await;
        to(owner.set_pal(partition, object, &ObjectPal::default())).await.unwrap();
        to(cluster.manager.maintain()).await;
        assert!(to(owner.get_pal(partition, object)).await.unwrap().is_empty(), "nothing left to retry");

        drop((a, owner));
        auth.halt();
        cluster.stop().await;
    });
}

/// On-demand push: a drive whose PAL lost the caller (changed behind the
/// manager's back, or never set) refuses a request by identity with
/// `NOT_IN_PAL`; the client asks the manager (`REFRESH_PAL`), which checks
/// the ACL and sets the PAL again, and retries once — the caller notices
/// nothing. A caller the ACL no longer grants gets the permission error,
/// and no drive is written for it.
#[test]
fn a_lost_pal_is_set_again_on_demand() {
    run(async {
        let (auth, cluster, admin) = pal_cluster(AuthScheme::PALS, 2).await;
        let partition = cluster.manager.config().partition;
        let (alice, bob) = (auth.grant(USER_A, PW_A, 0).await, auth.grant(USER_B, PW_B, 0).await);
        let alice_fs = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();
        let bob_fs = manager_login(&cluster, bob.credential, &bob.idkey).await.unwrap();
        to(alice_fs.write_file("/shared/f", DATA)).await.unwrap();
        to(alice_fs.chmod("/shared/f", 0o600)).await.unwrap();
        to(alice_fs.set_acl("/shared/f", vec![entry(nasd_fs::AclWho::User(UID_B), nasd_fs::ACL_READ)])).await.unwrap();
        let component = to(admin.get_layout("/shared/f")).await.unwrap().components[0].0;
        let mut owner = drive_owner_of(&cluster, component.object.drive).await;
        let object = component.object.object;
        let before = to(owner.get_pal(partition, object)).await.unwrap();

        // Emptied behind the manager's back: alice's read refreshes it and goes through.
        to(owner.set_pal(partition, object, &ObjectPal::default())).await.unwrap();
        assert_eq!(to(alice_fs.read_file("/shared/f")).await.unwrap(), DATA);
        assert_eq!(to(owner.get_pal(partition, object)).await.unwrap(), before, "set again as the ACL stands");
        // Altered to name someone else only: the same for a write.
        let other = Pal::new(vec![PalEntry { principal: Principal::User(4242), rights: rights::READ }]);
        to(owner.set_pal(partition, object, &ObjectPal { collection: 0, pal: other })).await.unwrap();
        to(alice_fs.write_file("/shared/f", b"rewritten")).await.unwrap();
        assert_eq!(to(bob_fs.read_file("/shared/f")).await.unwrap(), b"rewritten");

        // Bob opens it while granted; alice takes his entry away: the drive refuses his
        // next read, and the manager refuses to put him back.
        let file = to(bob_fs.open("/shared/f", false)).await.unwrap();
        to(alice_fs.set_acl("/shared/f", Vec::new())).await.unwrap();
        let after = to(owner.get_pal(partition, object)).await.unwrap();
        assert_eq!(after.pal.rights_for(UID_B, 0), None);
        assert_eq!(fs_status(to(file.read_at(0, 4)).await), FsStatus::PermissionDenied);
        assert_eq!(to(owner.get_pal(partition, object)).await.unwrap(), after, "no PAL set for a refused caller");

        drop((file, alice_fs, bob_fs, admin, owner));
        auth.halt();
        cluster.stop().await;
    });
}

/// On a PALs-only partition other users read what the mode lets them, from
/// the drives by identity: the file's PAL has an everyone entry with the
/// rights every class of the mode gives. It grants no one more than the
/// manager does: others do not write a 0644 file, a chmod to 0640 takes the
/// entry away before it returns, and a mode that denies the group class
/// what others get (0604) gives no everyone entry — a drive cannot tell a
/// group member from anyone else. The "other" bits used to reach no PAL: a
/// world-readable file was refused to everyone but its owner (`NOT_IN_PAL`,
/// again after the refresh).
#[test]
fn others_read_what_the_mode_allows_on_a_pal_partition() {
    run(async {
        let (auth, cluster, admin) = pal_cluster(AuthScheme::PALS, 2).await;
        let partition = cluster.manager.config().partition;
        let (mut root, _) = auth.login(ROOT, ROOT_PW, 0).await.unwrap();
        to(root.add_user(CAROL, PW_C, UID_C, 0, false)).await.unwrap();
        let (mut alice_auth, alice) = auth.login(USER_A, PW_A, 0).await.unwrap();
        let gid = to(alice_auth.create_group("project")).await.unwrap().gid;
        to(alice_auth.set_group_member(gid, CAROL, true)).await.unwrap();
        let (bob, carol) = (auth.grant(USER_B, PW_B, 0).await, auth.grant(CAROL, PW_C, 0).await);
        let alice_fs = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();
        let bob_fs = manager_login(&cluster, bob.credential, &bob.idkey).await.unwrap();
        let carol_fs = manager_login(&cluster, carol.credential, &carol.idkey).await.unwrap();
        // Striped over both drives, so every component's PAL is checked.
        to(alice_fs.write_file("/shared/f", b"")).await.unwrap();
        to(alice_fs.set_layout("/shared/f", Some(nasd_fs::Layout::parse("stripe:2@64K").unwrap()))).await.unwrap();
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        to(alice_fs.write_file("/shared/f", &big)).await.unwrap();
        to(alice_fs.chown("/shared/f", None, Some(gid))).await.unwrap();
        to(alice_fs.chmod("/shared/f", 0o644)).await.unwrap();

        // Through the file system: the manager grants bob (other) and carol (group) read, and
        // the drives let their identities read; no capability is minted.
        assert_eq!(to(bob_fs.read_file("/shared/f")).await.unwrap(), big, "bob, another user");
        assert_eq!(to(carol_fs.read_file("/shared/f")).await.unwrap(), big, "carol, in the file's group");
        assert_eq!(fs_status(to(bob_fs.write_file("/shared/f", DATA)).await), FsStatus::PermissionDenied);
        assert_eq!(cluster.manager.capabilities_minted(), 0);
        // At the drives alone: every identity reads, none but alice's writes.
        let components = to(admin.get_layout("/shared/f")).await.unwrap().components;
        for (component, _) in &components {
            let (drive, object) = (component.object.drive, component.object.object);
            let mut b = drive_as_on(&cluster, drive, bob.credential, &bob.idkey).await;
            to(b.read(partition, object, &whole())).await.expect("bob reads by identity");
            assert_eq!(drive_status(to(b.write(partition, object, &whole(), DATA)).await), Status::RightsInsufficient);
        }

        // 0666: everyone writes, through the file system and at the drives.
        to(alice_fs.chmod("/shared/f", 0o666)).await.unwrap();
        to(bob_fs.write_file("/shared/f", DATA)).await.expect("bob writes a 0666 file by identity");
        assert_eq!(to(carol_fs.read_file("/shared/f")).await.unwrap(), DATA);
        let first = to(admin.get_layout("/shared/f")).await.unwrap().components[0].0.object;
        let (first_drive, first) = (first.drive, first.object);
        let mut b = drive_as_on(&cluster, first_drive, bob.credential, &bob.idkey).await;
        let mut c = drive_as_on(&cluster, first_drive, carol.credential, &carol.idkey).await;
        to(b.read(partition, first, &whole())).await.expect("bob reads the 0666 file by identity");
        // 0640: the moment chmod returns, others read nothing at the drive; the group class
        // still reads through the manager, which no drive entry carries (see
        // group_access_goes_through_capabilities).
        to(alice_fs.chmod("/shared/f", 0o640)).await.unwrap();
        assert_eq!(drive_status(to(b.read(partition, first, &whole())).await), Status::NotInPal);
        assert_eq!(fs_status(to(bob_fs.read_file("/shared/f")).await), FsStatus::PermissionDenied);
        // 0604: others may read, the group class may not. Carol's identity gets nothing at the
        // drive; bob's does not either (the documented limitation: he reads on `both`).
        to(alice_fs.chmod("/shared/f", 0o604)).await.unwrap();
        assert_eq!(drive_status(to(c.read(partition, first, &whole())).await), Status::NotInPal, "carol, group");
        assert_eq!(fs_status(to(carol_fs.read_file("/shared/f")).await), FsStatus::PermissionDenied);
        assert_eq!(drive_status(to(b.read(partition, first, &whole())).await), Status::NotInPal);

        drop((alice_fs, bob_fs, carol_fs, admin, alice_auth, b, c));
        auth.halt();
        cluster.stop().await;
    });
}

/// Group entries and the mode's group class are not flattened into PALs
/// (a drive matches users and roles only). On a partition that takes both
/// schemes the client falls back to the capability the manager minted at
/// open when the drive says `NOT_IN_PAL`; on a PALs-only partition the
/// client asks for the PAL once (`REFRESH_PAL`: the manager grants it, and
/// sets the same PAL), retries once and reports the drive's refusal — no
/// loop.
#[test]
fn group_access_goes_through_capabilities() {
    run(async {
        for scheme in [AuthScheme::BOTH, AuthScheme::PALS] {
            let (auth, cluster, admin) = pal_cluster(scheme, 1).await;
            let (mut alice_auth, alice) = auth.login(USER_A, PW_A, 0).await.unwrap();
            let gid = to(alice_auth.create_group("project")).await.unwrap().gid;
            to(alice_auth.set_group_member(gid, USER_B, true)).await.unwrap();
            let bob = auth.grant(USER_B, PW_B, 0).await;
            let alice_fs = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();
            let bob_fs = manager_login(&cluster, bob.credential, &bob.idkey).await.unwrap();
            to(alice_fs.write_file("/shared/g", DATA)).await.unwrap();
            to(alice_fs.chown("/shared/g", None, Some(gid))).await.unwrap();
            to(alice_fs.chmod("/shared/g", 0o640)).await.unwrap();
            let read = to(bob_fs.read_file("/shared/g")).await;
            if scheme == AuthScheme::BOTH {
                assert_eq!(read.unwrap(), DATA, "bob's capability, after the drive found no PAL entry");
            } else {
                let e = read.unwrap_err();
                assert!(format!("{e:?}").contains("NotInPal"), "refused by the drive after one refresh: {e:?}");
            }
            drop((alice_fs, bob_fs, admin, alice_auth));
            auth.halt();
            cluster.stop().await;
        }
    });
}

/// A disabled user: the authentication server refuses it at once, and an
/// identity session already open at the manager ends at its first request
/// after the manager asks the authentication server again
/// (`identity_recheck`, here before every request). A drive knows no users:
/// the identity key in hand reads there until the administrator retires
/// its key id — the documented way to cut a user off the drives at once.
#[test]
fn a_disabled_user_is_cut_off() {
    run(async {
        let (auth, cluster, admin) =
            pal_cluster_with(AuthScheme::PALS, 1, |c| ManagerConfig { identity_recheck: Duration::ZERO, ..c }).await;
        let partition = cluster.manager.config().partition;
        let (mut root, _) = auth.login(ROOT, ROOT_PW, 0).await.unwrap();
        let alice = auth.grant(USER_A, PW_A, 0).await;
        let alice_fs = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();
        to(alice_fs.write_file("/shared/f", DATA)).await.unwrap();
        to(alice_fs.chmod("/shared/f", 0o600)).await.unwrap();
        let object = to(admin.get_layout("/shared/f")).await.unwrap().components[0].0.object.object;

        to(root.set_user_enabled(USER_A, false)).await.unwrap();
        assert_eq!(fs_status(to(alice_fs.read_file("/shared/f")).await), FsStatus::NotPermitted, "the open session");
        assert_eq!(fs_status(manager_login(&cluster, alice.credential, &alice.idkey).await), FsStatus::NotPermitted);
        let mut a = drive_as(&cluster, alice.credential, &alice.idkey).await;
        assert_eq!(to(a.read(partition, object, &whole())).await.unwrap().1, DATA, "a drive knows no users");
        assert_eq!(to(root.rotate_key()).await.unwrap(), 2);
        // The administrator's session is by identity too: one under key 2 outlives key 1.
        let root2 = auth.grant(ROOT, ROOT_PW, 0).await;
        let admin2 = manager_login(&cluster, root2.credential, &root2.idkey).await.unwrap();
        to(root.retire_key(1)).await.unwrap();
        to(admin2.sync_identity_keys()).await.unwrap();
        assert_eq!(drive_status(to(a.read(partition, object, &whole())).await), Status::KeyVersionRetired);

        drop((alice_fs, admin, admin2, a, root));
        auth.halt();
        cluster.stop().await;
    });
}

/// A gateway acts (`AS_USER`) for a user only while the authentication
/// server has that user enabled: disabled, every request made for it is
/// refused (here at once: `identity_recheck` zero; by default within
/// `ACTED_FOR_RECHECK_MAX`), while the gateway's own requests and those for
/// others go on; enabled again, it is served again.
#[test]
fn a_gateway_acts_for_no_disabled_user() {
    run(async {
        let (auth, cluster, admin) =
            pal_cluster_with(AuthScheme::BOTH, 1, |c| ManagerConfig { identity_recheck: Duration::ZERO, ..c }).await;
        let (mut root, _) = auth.login(ROOT, ROOT_PW, 0).await.unwrap();
        let (alice, bob) = (auth.grant(USER_A, PW_A, 0).await, auth.grant(USER_B, PW_B, 0).await);
        drop(alice);
        to(admin.set_gateway(USER_B, Some((UID_A, UID_B)))).await.unwrap();
        let gateway = manager_login(&cluster, bob.credential, &bob.idkey).await.unwrap();
        let for_alice = gateway.as_user(UID_A, UID_A, &[]).unwrap();
        let for_bob = gateway.as_user(UID_B, UID_B, &[]).unwrap();
        to(for_alice.write_file("/shared/a", DATA)).await.expect("alice's write through the gateway");

        to(root.set_user_enabled(USER_A, false)).await.unwrap();
        let refused = to(for_alice.read_file("/shared/a")).await;
        let Err(said) = refused else { panic!("the gateway acted for a disabled user") };
        assert_eq!(said.status(), Some(FsStatus::NotPermitted), "{said}");
        assert!(said.to_string().contains("disabled"), "{said}");
        assert_eq!(fs_status(to(for_alice.write_file("/shared/b", DATA)).await), FsStatus::NotPermitted);
        to(for_bob.write_file("/shared/by-bob", DATA)).await.expect("others are still served");
        to(gateway.stat("/shared")).await.expect("the gateway itself is still served");
        assert!(to(admin.stat("/shared/b")).await.is_err(), "nothing was made for the disabled user");

        to(root.set_user_enabled(USER_A, true)).await.unwrap();
        assert_eq!(to(for_alice.read_file("/shared/a")).await.unwrap(), DATA, "enabled again");

        drop((gateway, for_alice, for_bob, admin, root));
        auth.halt();
        cluster.stop().await;
    });
}

/// With the default recheck times the manager trusts what the
/// authentication server said of a user for a while; an administrator who
/// disabled one there says so (`SYNC_IDENTITY_KEYS`, which `nasd auth
/// disable` sends): from then on the user's open identity session and a
/// gateway acting for it are refused at their next request, and enabled
/// again (and said again) both are served at their next request.
#[test]
fn a_user_disabled_and_said_is_refused_at_once() {
    run(async {
        let (auth, cluster, admin) = pal_cluster_with(AuthScheme::BOTH, 1, |c| c).await;
        assert!(cluster.manager.config().identity_recheck >= Duration::from_secs(10), "the default, long");
        let (mut root, _) = auth.login(ROOT, ROOT_PW, 0).await.unwrap();
        let (alice, bob) = (auth.grant(USER_A, PW_A, 0).await, auth.grant(USER_B, PW_B, 0).await);
        to(admin.set_gateway(USER_B, Some((UID_A, UID_A)))).await.unwrap();
        let alice_fs = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();
        let gateway = manager_login(&cluster, bob.credential, &bob.idkey).await.unwrap();
        let for_alice = gateway.as_user(UID_A, UID_A, &[]).unwrap();
        to(alice_fs.write_file("/shared/a", DATA)).await.unwrap();
        to(for_alice.read_file("/shared/a")).await.expect("the gateway acts for alice");

        to(root.set_user_enabled(USER_A, false)).await.unwrap();
        to(admin.sync_identity_keys()).await.unwrap();
        assert_eq!(fs_status(to(alice_fs.read_file("/shared/a")).await), FsStatus::NotPermitted, "the open session");
        assert_eq!(
            fs_status(to(for_alice.read_file("/shared/a")).await),
            FsStatus::NotPermitted,
            "through the gateway"
        );
        to(gateway.stat("/shared")).await.expect("the gateway itself is still served");

        to(root.set_user_enabled(USER_A, true)).await.unwrap();
        to(admin.sync_identity_keys()).await.unwrap();
        assert_eq!(to(for_alice.read_file("/shared/a")).await.unwrap(), DATA, "enabled again, through the gateway");
        let alice_fs = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();
        assert_eq!(to(alice_fs.read_file("/shared/a")).await.unwrap(), DATA, "and by a new session");

        drop((gateway, for_alice, alice_fs, admin, root));
        auth.halt();
        cluster.stop().await;
    });
}

/// Several managers on one PostgreSQL database: a PAL push one manager
/// missed is in the shared store, so another manager's maintenance pass
/// (whichever holds the `pals` lease) sets it once the drive is back.
#[test]
fn another_manager_retries_a_missed_pal_push() {
    let server =
        nasd_meta::testing::PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let url = server.fresh_url();
    run(async move {
        let metadata = Some(url.parse::<nasd_manager::Location>().expect("a PostgreSQL URL"));
        let on_pg = |c| ManagerConfig { metadata: metadata.clone(), ..c };
        let (auth, mut cluster, admin) = pal_cluster_with(AuthScheme::PALS, 1, on_pg).await;
        let partition = cluster.manager.config().partition;
        let alice = auth.grant(USER_A, PW_A, 0).await;
        let alice_fs = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();
        to(alice_fs.write_file("/shared/f", DATA)).await.unwrap();
        to(alice_fs.chmod("/shared/f", 0o600)).await.unwrap();
        let object = to(admin.get_layout("/shared/f")).await.unwrap().components[0].0.object.object;
        // A directory of alice's whose shared entries change while the drive is down.
        to(alice_fs.mkdir("/shared/p", 0o755)).await.unwrap();
        to(alice_fs.write_file("/shared/p/g", DATA)).await.unwrap();
        to(alice_fs.chmod("/shared/p/g", 0o600)).await.unwrap();
        let member = to(admin.get_layout("/shared/p/g")).await.unwrap().components[0].0.object.object;
        let bob = auth.grant(USER_B, PW_B, 0).await;

        let stopped = cluster.drives.remove(0).halt().await;
        assert_eq!(fs_status(to(alice_fs.chmod("/shared/f", 0o200)).await), FsStatus::DriveUnavailable);
        let shared = nasd_fs::AclEntry {
            who: nasd_fs::AclWho::User(UID_B),
            rights: nasd_fs::ACL_READ,
            flags: nasd_fs::ACL_SHARED,
        };
        assert_eq!(fs_status(to(alice_fs.set_acl("/shared/p", vec![shared])).await), FsStatus::DriveUnavailable);
        let m2 = cluster.start_other_manager("manager-2", on_pg(pal_config(&auth, AuthScheme::PALS)), false).await;
        cluster.drives.insert(0, stopped.start().await);
        let mut a = drive_as(&cluster, alice.credential, &alice.idkey).await;
        assert_eq!(to(a.read(partition, object, &whole())).await.unwrap().1, DATA, "the old PAL, for now");
        let mut b = drive_as(&cluster, bob.credential, &bob.idkey).await;
        assert_eq!(drive_status(to(b.read(partition, member, &whole())).await), Status::NotInPal, "no super PAL yet");
        to(m2.manager.maintain()).await;
        assert_eq!(drive_status(to(a.read(partition, object, &whole())).await), Status::RightsInsufficient);
        assert_eq!(to(b.read(partition, member, &whole())).await.unwrap().1, DATA, "the super PAL, from the record");

        drop((alice_fs, admin, a, b));
        m2.stop().await;
        auth.halt();
        cluster.stop().await;
    });
    drop(server);
}

/// Super PALs (DSFS §4.1–4.2): a directory's shared entries hold live for
/// every file created in it. Granting them, and taking them away, costs
/// one `SET_SUPER_PAL` per drive however many files the directory holds —
/// against one `SET_PAL` per component of every file for the same grant
/// made file by file — and is in force on every drive the moment
/// `SET_ACL` returns. A drive that misses it is caught up from the
/// metadata store's record; removing the directory clears the super PAL.
#[test]
fn a_directory_acl_change_is_one_super_pal_per_drive() {
    const FILES: usize = 12;
    run(async {
        let (auth, mut cluster, admin) = pal_cluster(AuthScheme::PALS, 2).await;
        let partition = cluster.manager.config().partition;
        let (alice, bob) = (auth.grant(USER_A, PW_A, 0).await, auth.grant(USER_B, PW_B, 0).await);
        let alice_fs = manager_login(&cluster, alice.credential, &alice.idkey).await.unwrap();
        let bob_fs = manager_login(&cluster, bob.credential, &bob.idkey).await.unwrap();
        to(alice_fs.mkdir("/shared/proj", 0o755)).await.unwrap();
        let proj = to(alice_fs.stat("/shared/proj")).await.unwrap().attr.ino;
        let mut objects = Vec::new();
        for i in 0..FILES {
            let path = format!("/shared/proj/f{i}");
            to(alice_fs.write_file(&path, DATA)).await.unwrap();
            to(alice_fs.chmod(&path, 0o600)).await.unwrap();
            let c = to(admin.get_layout(&path)).await.unwrap().components[0].0.object;
            objects.push((c.drive, c.object));
        }
        assert!(objects.iter().any(|o| o.0 != objects[0].0), "files on both drives");
        assert_eq!(fs_status(to(bob_fs.read_file("/shared/proj/f0")).await), FsStatus::PermissionDenied);
        let mut owners = Vec::new();
        for d in cluster.manager.drives() {
            owners.push((d.drive, drive_owner_of(&cluster, d.drive).await));
        }

        // One directory change: one write per drive, and bob reads every file by identity.
        let writes = cluster.manager.pal_writes();
        let bob_reads = nasd_fs::AclEntry {
            who: nasd_fs::AclWho::User(UID_B),
            rights: nasd_fs::ACL_READ,
            flags: nasd_fs::ACL_SHARED,
        };
        to(alice_fs.set_acl("/shared/proj", vec![bob_reads])).await.unwrap();
        assert_eq!(cluster.manager.pal_writes() - writes, 2, "one super PAL per drive, not one PAL per file");
        for (drive, owner) in &mut owners {
            let sup = to(owner.get_super_pal(partition, proj)).await.unwrap();
            assert_eq!(sup.rights_for(UID_B, 0), Some(rights::READ | rights::GETATTR), "drive {drive}");
        }
        for (i, (drive, object)) in objects.iter().enumerate() {
            let owner = &mut owners.iter_mut().find(|o| o.0 == *drive).unwrap().1;
            let pal = to(owner.get_pal(partition, *object)).await.unwrap();
            assert_eq!(pal.collection, proj, "f{i} is a member of its directory's collection");
            assert_eq!(pal.pal.rights_for(UID_B, 0), None, "bob is not in f{i}'s own PAL");
            assert_eq!(to(bob_fs.read_file(&format!("/shared/proj/f{i}"))).await.unwrap(), DATA);
        }

        // The same grant made file by file: one PAL per component of every file.
        let writes = cluster.manager.pal_writes();
        for i in 0..FILES {
            let read = entry(nasd_fs::AclWho::User(UID_C), nasd_fs::ACL_READ);
            to(alice_fs.set_acl(&format!("/shared/proj/f{i}"), vec![read])).await.unwrap();
        }
        assert_eq!(cluster.manager.pal_writes() - writes, FILES as u64);

        // Taken away: refused on every drive the moment SET_ACL returns.
        let writes = cluster.manager.pal_writes();
        to(alice_fs.set_acl("/shared/proj", Vec::new())).await.unwrap();
        assert_eq!(cluster.manager.pal_writes() - writes, 2);
        for (drive, object) in &objects {
            let mut b = drive_as_on(&cluster, *drive, bob.credential, &bob.idkey).await;
            assert_eq!(drive_status(to(b.read(partition, *object, &whole())).await), Status::NotInPal);
        }
        assert_eq!(fs_status(to(bob_fs.read_file("/shared/proj/f0")).await), FsStatus::PermissionDenied);

        // A drive down during the change: DRIVE_UNAVAILABLE, the change committed and recorded;
        // the next maintenance pass after the drive is back sets the super PAL there.
        let halted = cluster.drives.remove(1).halt().await;
        assert_eq!(fs_status(to(alice_fs.set_acl("/shared/proj", vec![bob_reads])).await), FsStatus::DriveUnavailable);
        cluster.drives.insert(1, halted.start().await);
        to(cluster.manager.maintain()).await;
        for (drive, _) in &objects {
            let mut owner = drive_owner_of(&cluster, *drive).await;
            let sup = to(owner.get_super_pal(partition, proj)).await.unwrap();
            assert_eq!(sup.rights_for(UID_B, 0), Some(rights::READ | rights::GETATTR), "drive {drive} caught up");
        }
        for i in 0..FILES {
            assert_eq!(to(bob_fs.read_file(&format!("/shared/proj/f{i}"))).await.unwrap(), DATA);
        }

        // The directory removed (its files moved out first, still members): the grant goes
        // with it, at the manager and on every drive.
        to(alice_fs.mkdir("/shared/elsewhere", 0o755)).await.unwrap();
        for i in 0..FILES {
            to(alice_fs.rename(&format!("/shared/proj/f{i}"), &format!("/shared/elsewhere/f{i}"))).await.unwrap();
        }
        assert_eq!(to(bob_fs.read_file("/shared/elsewhere/f0")).await.unwrap(), DATA, "still a member");
        let writes = cluster.manager.pal_writes();
        to(alice_fs.rmdir("/shared/proj")).await.unwrap();
        assert_eq!(cluster.manager.pal_writes() - writes, 2);
        for d in cluster.manager.drives() {
            let mut owner = drive_owner_of(&cluster, d.drive).await;
            assert!(to(owner.get_super_pal(partition, proj)).await.unwrap().is_empty(), "drive {} forgot it", d.drive);
        }
        assert_eq!(fs_status(to(bob_fs.read_file("/shared/elsewhere/f0")).await), FsStatus::PermissionDenied);
        assert_eq!(cluster.manager.capabilities_minted(), 0);

        drop((alice_fs, bob_fs, admin, owners));
        auth.halt();
        cluster.stop().await;
    });
}

/// How long identity keys live in the renewal tests: a few lifetimes pass
/// in each.
const SHORT_LIFE: Duration = Duration::from_secs(3);

/// An authentication server issuing identity keys that live `lifetime`, a
/// cluster of two drives whose partition takes PALs only, user A added,
/// and the administrator's session (renewing its identity) after the keys
/// and scheme reached the drives and `/shared` was made.
async fn short_lived(lifetime: Duration) -> (Auth0, Cluster, FsClient) {
    let auth = Auth0::start_with(AuthConfig { identity_lifetime: lifetime, ..AuthConfig::default() }).await;
    let config = pal_config(&auth, AuthScheme::PALS);
    let cluster = Cluster::start(ClusterOptions { config, drives: 2, ..ClusterOptions::default() }).await;
    let (mut root, _) = auth.login(ROOT, ROOT_PW, 0).await.unwrap();
    to(root.add_user(USER_A, PW_A, UID_A, 0, false)).await.unwrap();
    let admin = renewing(&auth, &cluster, ROOT, ROOT_PW).await;
    to(admin.sync_identity_keys()).await.unwrap();
    to(admin.mkdir("/shared", 0o777)).await.unwrap();
    (auth, cluster, admin)
}

/// A client logged in with a fresh identity of `user`, renewing it from
/// the authentication server.
async fn renewing(auth: &Auth0, c: &Cluster, user: &str, password: &str) -> FsClient {
    let grant = auth.grant(user, password, 0).await;
    let config = FsConfig {
        identity_source: Some(auth.source(user, password, 0)),
        ..identity_config(c, grant.credential, grant.idkey)
    };
    to(FsClient::connect(&config)).await.unwrap()
}

fn unix_now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// Sleeps until the credential `c` has expired (by this machine's clock,
/// which the manager and drives here share) and `after` more.
async fn past_expiry(c: &IdentityData, after: Duration) {
    let left = Duration::from_nanos(c.expiration_ns.saturating_sub(unix_now_ns()));
    tokio::time::sleep(left + after).await;
}

/// Bytes of round `n`, different each round.
fn round_bytes(n: usize) -> Vec<u8> {
    (0..150_000u32).map(|i| (i as usize * 7 + n * 13) as u8).collect()
}

/// A client given a renewal source keeps reading and writing a striped file
/// on a PALs-only partition — by identity alone, at the manager and the
/// drives — across several lifetimes of its identity key: through an open
/// file whose drive connections hold the identity, through new opens, and
/// through its change watcher. The same user's client without one is
/// refused once its key expires, saying so.
#[test]
fn identity_keys_are_renewed_before_they_expire() {
    run(async {
        let (auth, cluster, admin) = short_lived(SHORT_LIFE).await;
        let alice = renewing(&auth, &cluster, USER_A, PW_A).await;
        let plain = {
            let g = auth.grant(USER_A, PW_A, 0).await;
            manager_login(&cluster, g.credential, &g.idkey).await.unwrap()
        };
        // A file striped over both drives.
        to(alice.write_file("/shared/f", b"")).await.unwrap();
        to(alice.set_layout("/shared/f", Some(nasd_fs::Layout::parse("stripe:2@64K").unwrap()))).await.unwrap();
        to(alice.write_file("/shared/f", &round_bytes(0))).await.unwrap();
        assert_eq!(to(plain.read_file("/shared/f")).await.unwrap(), round_bytes(0));
        let first = alice.identity_credential().expect("an identity");
        let open = to(alice.open("/shared/f", true)).await.unwrap();
        let mut watcher = alice.watcher();
        to(watcher.wait(Duration::ZERO)).await.unwrap();

        // Four rounds, three quarters of a lifetime apart: requests land both inside the
        // renewal margin and after an expiry.
        for round in 1..=4 {
            tokio::time::sleep(SHORT_LIFE * 3 / 4).await;
            // Straight to the drives first (the open file holds its bindings).
            let before = round_bytes(round - 1);
            assert_eq!(to(open.read_at(0, before.len() as u64)).await.unwrap(), before, "round {round}: read");
            let data = round_bytes(round);
            to(open.write_at(0, &data)).await.unwrap_or_else(|e| panic!("round {round}: write: {e}"));
            to(open.flush()).await.unwrap_or_else(|e| panic!("round {round}: flush: {e}"));
            assert_eq!(to(open.read_at(0, data.len() as u64)).await.unwrap(), data, "round {round}");
            assert_eq!(to(alice.read_file("/shared/f")).await.unwrap(), data, "round {round}: a new open");
            to(alice.stat("/shared")).await.unwrap_or_else(|e| panic!("round {round}: the manager session: {e}"));
            to(watcher.wait(Duration::ZERO)).await.unwrap_or_else(|e| panic!("round {round}: the watcher: {e}"));
        }
        assert!(unix_now_ns() > first.expiration_ns, "the test outlived the first identity");
        let now = alice.identity_credential().unwrap();
        assert!(now.expiration_ns > first.expiration_ns, "a later identity is held");
        assert_eq!((now.user, now.role), (first.user, first.role), "the same user and role");
        assert!(alice.identity_renewals() >= 2, "renewed: {}", alice.identity_renewals());
        assert_eq!(alice.identity_renewal_failures(), 0);
        let attr = to(open.close()).await.unwrap();
        assert_eq!(attr.size, round_bytes(4).len() as u64);

        // Without a source, the same user's client is refused once its key expired.
        let refused = to(plain.read_file("/shared/f")).await.expect_err("read under an expired identity");
        assert!(refused.to_string().contains("expired"), "{refused}");
        assert_eq!(plain.identity_renewals(), 0);

        drop((alice, plain, admin));
        auth.halt();
        cluster.stop().await;
    });
}

/// With the authentication server down, renewing fails: the client keeps
/// using its identity until it expires (failures logged and counted), is
/// refused after that, and renews at its next request once the server is
/// back.
#[test]
fn renewal_survives_an_authentication_server_outage() {
    run(async {
        // Long enough that requests in the renewal margin (a tenth) finish before expiry.
        let life = Duration::from_secs(10);
        let (mut auth, cluster, admin) = short_lived(life).await;
        let alice = renewing(&auth, &cluster, USER_A, PW_A).await;
        to(alice.write_file("/shared/g", b"")).await.unwrap();
        to(alice.set_layout("/shared/g", Some(nasd_fs::Layout::parse("stripe:2@64K").unwrap()))).await.unwrap();
        to(alice.write_file("/shared/g", &round_bytes(0))).await.unwrap();
        let first = alice.identity_credential().expect("an identity");
        auth.halt();

        // Requests until half a margin before expiry all work; those in the margin try to
        // renew and fail.
        let stop_at = first.expiration_ns - (nasd_fs::renew_margin(life) / 2).as_nanos() as u64;
        let mut requests = 0;
        while unix_now_ns() < stop_at {
            assert_eq!(to(alice.read_file("/shared/g")).await.unwrap(), round_bytes(0));
            requests += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(requests > 1);
        assert!(alice.identity_renewal_failures() >= 1, "renewal was tried in the margin and failed");
        assert_eq!(alice.identity_renewals(), 0);
        assert_eq!(alice.identity_credential(), Some(first), "the current identity was kept");

        // Past expiry, with the server still down: refused, saying why.
        past_expiry(&first, Duration::from_millis(200)).await;
        let refused = to(alice.read_file("/shared/g")).await.expect_err("read under an expired identity");
        assert!(refused.to_string().contains("expired"), "{refused}");

        // The server back: the next request (after the retry pause) renews and works.
        auth.resume().await;
        tokio::time::sleep(nasd_fs::RENEW_RETRY_PAUSE).await;
        assert_eq!(to(alice.read_file("/shared/g")).await.unwrap(), round_bytes(0));
        to(alice.write_file("/shared/g", &round_bytes(1))).await.unwrap();
        assert_eq!(to(alice.read_file("/shared/g")).await.unwrap(), round_bytes(1));
        assert_eq!(alice.identity_renewals(), 1);
        assert!(alice.identity_credential().unwrap().expiration_ns > first.expiration_ns);

        drop((alice, admin));
        auth.halt();
        cluster.stop().await;
    });
}

/// Retiring the key id an identity was made with ends it before its
/// lifetime: a client with a renewal source gets a fresh identity under the
/// live key at its next request — refused at the manager (its session's key
/// retired) or at a drive (`KEY_VERSION_RETIRED`) — and goes on. Renewal
/// before expiry never fires here (an hour's lifetime).
#[test]
fn a_retired_identity_key_is_renewed() {
    run(async {
        let (auth, cluster, _admin) = pal_cluster(AuthScheme::PALS, 2).await;
        let (mut root, _) = auth.login(ROOT, ROOT_PW, 0).await.unwrap();
        let alice = renewing(&auth, &cluster, USER_A, PW_A).await;
        let names = renewing(&auth, &cluster, USER_A, PW_A).await;
        to(alice.write_file("/shared/f", b"")).await.unwrap();
        to(alice.set_layout("/shared/f", Some(nasd_fs::Layout::parse("stripe:2@64K").unwrap()))).await.unwrap();
        let data = round_bytes(5);
        to(alice.write_file("/shared/f", &data)).await.unwrap();
        let open = to(alice.open("/shared/f", false)).await.unwrap();
        assert_eq!(to(open.read_at(0, data.len() as u64)).await.unwrap(), data);
        to(names.stat("/shared/f")).await.unwrap();
        assert_eq!(alice.identity_credential().unwrap().key_id, 1);

        // Key 2 for new logins, on every drive; then key 1 retired everywhere.
        assert_eq!(to(root.rotate_key()).await.unwrap(), 2);
        let root2 = auth.grant(ROOT, ROOT_PW, 0).await;
        let admin2 = manager_login(&cluster, root2.credential, &root2.idkey).await.unwrap();
        to(admin2.sync_identity_keys()).await.unwrap();
        to(root.retire_key(1)).await.unwrap();
        to(admin2.sync_identity_keys()).await.unwrap();

        // The open file goes straight to the drives, which refuse key 1: renewed, read again.
        assert_eq!(to(open.read_at(0, data.len() as u64)).await.unwrap(), data);
        // The other client's manager session ends (key 1 retired): renewed, asked again.
        to(names.stat("/shared/f")).await.unwrap();
        for c in [&alice, &names] {
            assert_eq!(c.identity_credential().unwrap().key_id, 2);
            assert_eq!(c.identity_renewals(), 1);
        }
        assert_eq!(to(alice.read_file("/shared/f")).await.unwrap(), data);
        assert_eq!(to(names.read_file("/shared/f")).await.unwrap(), data);

        drop((alice, names, open, admin2));
        auth.halt();
        cluster.stop().await;
    });
}
