//! Passwords where an authentication server keeps them, end to end over real
//! daemons on loopback: a manager linked to one refuses `ADD_USER` and
//! `SET_PASSWORD` (saying where to go instead), and a password changed at
//! the authentication server (`CHANGE_PASSWORD`, `SET_PASSWORD`) is what
//! logs in from then on, while the manager session opened with an identity
//! key issued before goes on (a change is not a revocation).

#[path = "common/auth_server.rs"]
mod auth_server;
mod common;

use auth_server::{Auth0, ROOT, ROOT_PW};
use common::*;
use nasd_fs::{FsClient, FsConfig, FsError, FsStatus};
use nasd_login::auth_client::IdentityGrant;
use nasd_manager::ManagerConfig;

/// The manager session of `grant`.
async fn at_manager(c: &Cluster, grant: &IdentityGrant) -> FsClient {
    let config = FsConfig { identity: Some((grant.credential, grant.idkey.clone())), ..c.fs_config("", "") };
    to(FsClient::connect(&config)).await.expect("log in at the manager by identity")
}

#[track_caller]
fn refused(r: Result<(), FsError>) -> (FsStatus, String) {
    match r {
        Err(FsError::Fs { status, message }) => (status, message),
        Err(e) => panic!("expected a refusal from the manager, got {e:?}"),
        Ok(()) => panic!("expected a refusal from the manager"),
    }
}

#[test]
fn a_linked_manager_refuses_users_and_passwords_and_changes_at_the_auth_server_take() {
    run(async {
        let auth = Auth0::start().await;
        let config = ManagerConfig { pool_target: 4, auth: Some(auth.link()), ..ManagerConfig::default() };
        let cluster = Cluster::start(ClusterOptions { config, drives: 1, ..ClusterOptions::default() }).await;
        let (mut root, root_grant) = auth.login(ROOT, ROOT_PW, 0).await.unwrap();
        to(root.add_user(USER_A, PW_A, UID_A, 0, false)).await.unwrap();
        let admin = at_manager(&cluster, &root_grant).await;
        to(admin.mkdir("/shared", 0o777)).await.unwrap();

        // ADD_USER at the manager: refused, even to an administrator, saying where users are made.
        let (status, message) = refused(to(admin.add_user("dan", "dan password", 1003, 0, false)).await);
        assert_eq!(status, FsStatus::NotSupported, "{message}");
        assert!(message.contains("nasd auth add-user"), "{message}");
        assert_eq!(message, nasd_manager::ADD_USER_AT_AUTH_SERVER);
        assert!(to(admin.users()).await.unwrap().iter().all(|u| u.name != "dan"), "no user was made");
        // SET_PASSWORD at the manager: refused for anyone's, one's own included.
        let (status, message) = refused(to(admin.set_password(USER_A, "set at the manager")).await);
        assert_eq!((status, message.as_str()), (FsStatus::NotSupported, nasd_manager::PASSWORDS_AT_AUTH_SERVER));
        assert!(message.contains("nasd auth passwd"), "{message}");
        let (_, alice_grant) = auth.login(USER_A, PW_A, 0).await.unwrap();
        let alice = at_manager(&cluster, &alice_grant).await;
        let (status, _) = refused(to(alice.set_password(USER_A, "set at the manager")).await);
        assert_eq!(status, FsStatus::NotSupported);

        // Alice changes her password where it is kept: the old one no longer logs in, the new one
        // does and its identity key opens a manager session; the session opened before goes on.
        let (mut alice_auth, _) = auth.login(USER_A, PW_A, 0).await.unwrap();
        to(alice_auth.change_password(PW_A, "alice's new password")).await.unwrap();
        let old = auth.login(USER_A, PW_A, 0).await.err().expect("the old password is refused");
        assert_eq!(old.status(), Some(FsStatus::BadCredentials));
        to(alice.write_file("/shared/before", b"written with the identity issued before")).await.unwrap();
        let (_, fresh) = auth.login(USER_A, "alice's new password", 0).await.unwrap();
        let again = at_manager(&cluster, &fresh).await;
        assert_eq!(to(again.read_file("/shared/before")).await.unwrap(), b"written with the identity issued before");

        // The administrator resets it at the authentication server, no old one needed.
        to(root.set_password(USER_A, "reset by root")).await.unwrap();
        assert!(auth.login(USER_A, "alice's new password", 0).await.is_err());
        let (_, reset) = auth.login(USER_A, "reset by root", 0).await.unwrap();
        assert_eq!(reset.uid, UID_A);
    });
}

/// A gateway grant lives in the manager's record of its user, which a linked manager cannot be
/// asked to make (`ADD_USER` is refused): `SET_GATEWAY` makes it from the authentication
/// server's user of that name (`USER_BY_NAME`), and the user's identity session then acts for
/// the users in its range; a name the authentication server does not know is refused.
#[test]
fn a_linked_manager_grants_a_gateway_to_a_user_it_knows_only_from_the_auth_server() {
    const GUS: &str = "gus";
    const GUS_PW: &str = "gus password";
    const UID_GUS: u32 = 1500;
    run(async {
        let auth = Auth0::start().await;
        let config = ManagerConfig { pool_target: 4, auth: Some(auth.link()), ..ManagerConfig::default() };
        let cluster = Cluster::start(ClusterOptions { config, drives: 1, ..ClusterOptions::default() }).await;
        let (mut root, root_grant) = auth.login(ROOT, ROOT_PW, 0).await.unwrap();
        to(root.add_user(GUS, GUS_PW, UID_GUS, 0, false)).await.unwrap();
        to(root.add_user(USER_B, PW_B, UID_B, 0, false)).await.unwrap();
        let admin = at_manager(&cluster, &root_grant).await;
        to(admin.mkdir("/shared", 0o777)).await.unwrap();
        assert!(to(admin.users()).await.unwrap().iter().all(|u| u.name != GUS), "no manager record of gus yet");

        let (status, message) = refused(to(admin.set_gateway("nobody", Some((1000, 2000)))).await);
        assert_eq!(status, FsStatus::NotFound, "{message}");
        to(admin.set_gateway(GUS, Some((UID_B, UID_B)))).await.unwrap();
        let record = to(admin.users()).await.unwrap().into_iter().find(|u| u.name == GUS).expect("a record of gus");
        assert_eq!(
            (record.uid, record.gid, record.admin, record.gateway),
            (UID_GUS, UID_GUS, false, Some((UID_B, UID_B)))
        );

        // Gus, by identity, acts for bob: the file is bob's.
        let (_, gus_grant) = auth.login(GUS, GUS_PW, 0).await.unwrap();
        let gus = at_manager(&cluster, &gus_grant).await;
        let for_bob = gus.as_user(UID_B, UID_B, &[]).unwrap();
        to(for_bob.write_file("/shared/by-gus", b"as bob")).await.expect("bob's write through the gateway");
        assert_eq!(to(admin.stat("/shared/by-gus")).await.unwrap().attr.uid, UID_B);
        // The record's password logs in nowhere: the manager takes none.
        let Err(password) = to(FsClient::connect(&cluster.fs_config(GUS, GUS_PW))).await else {
            panic!("a password login at a linked manager")
        };
        assert_eq!(password.status(), Some(FsStatus::BadCredentials));
    });
}
