//! Manager unit tests that need no drive: configuration checks, request
//! limits, password hashing bounds.

use crate::service::Session;
use crate::{Manager, ManagerConfig, ARGON2_CONCURRENT_MAX};
use nasd_meta::Caller;
use nasd_proto::fs::{FsStatus, SYMLINK_TARGET_MAX};
use nasd_proto::manager::{Handle, ManagerReply, ManagerRequest, OpenMode, MANAGER_MESSAGE_MAX};
use nasd_proto::Protection;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn root() -> Session {
    Session::internal("root", Caller::ROOT)
}

/// The handle `s` gets for `path` by walking to it.
async fn walk(m: &Manager, s: &Session, path: &str) -> Handle {
    match m.handle(s, ManagerRequest::Walk { path: path.into(), follow: false, open: OpenMode::None }).await {
        Ok(ManagerReply::Entry(e)) => e.handle(),
        other => panic!("walk {path}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_are_checked_before_anything_else_and_bound_to_the_user() {
    let dir = tempfile::tempdir().unwrap();
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    let s = root();
    let alice = Session { admin: false, ..Session::internal("alice", Caller::new(1000, 1000)) };
    let root_dir = walk(&m, &s, "/").await;
    let mkdir = |parent: Handle| ManagerRequest::Mkdir { parent, name: "d".into(), mode: 0o755 };
    // A forged MAC, root's handle used by alice, and a handle of another inode with the MAC moved over.
    let forged = Handle { mac: [0; 32], ..root_dir };
    let other = walk(&m, &alice, "/").await;
    assert_eq!(other.ino, root_dir.ino);
    assert_ne!(other.mac, root_dir.mac, "the same inode has another handle for another user");
    for (what, who, h) in [("forged", &s, forged), ("root's, used by alice", &alice, root_dir)] {
        let e = m.handle(who, mkdir(h)).await.expect_err(what);
        assert_eq!(e.status, FsStatus::BadHandle, "{what}: {e}");
        let e = m.handle(who, ManagerRequest::GetAttr { handle: h, open: OpenMode::None }).await.expect_err(what);
        assert_eq!(e.status, FsStatus::BadHandle, "{what}: {e}");
    }
    let made = match m.handle(&s, mkdir(root_dir)).await {
        Ok(ManagerReply::Entry(e)) => e.handle(),
        other => panic!("{other:?}"),
    };
    let moved = Handle { ino: made.ino, site: made.site, mac: root_dir.mac };
    let e = m.handle(&s, ManagerRequest::GetAttr { handle: moved, open: OpenMode::None }).await.unwrap_err();
    assert_eq!(e.status, FsStatus::BadHandle, "a MAC names exactly one inode");
    // Handles outlive the manager (same manager.key and database).
    drop(m);
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    assert!(m.handle(&s, ManagerRequest::GetAttr { handle: made, open: OpenMode::None }).await.is_ok());
    // A new database under the same manager.key honours no old handle.
    drop(m);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.path().join(format!("{}{suffix}", crate::META_DB)));
    }
    assert!(!dir.path().join(crate::META_DB).exists());
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    let e = m.handle(&s, ManagerRequest::GetAttr { handle: root_dir, open: OpenMode::None }).await.unwrap_err();
    assert_eq!(e.status, FsStatus::BadHandle, "another file system");
}

#[test]
fn pools_larger_than_one_recorded_batch_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let too_big = ManagerConfig { pool_target: nasd_meta::BATCH_MAX + 1, ..ManagerConfig::default() };
    let e = Manager::open(dir.path(), too_big).expect_err("a refill could never be recorded");
    assert!(e.to_string().contains("object pool"), "{e}");
    let largest = ManagerConfig { pool_target: nasd_meta::BATCH_MAX, ..ManagerConfig::default() };
    Manager::open(dir.path(), largest).expect("the largest pool that one batch records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readdir_replies_fit_in_one_message_with_long_symlink_targets() {
    let dir = tempfile::tempdir().unwrap();
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    let s = root();
    let parent = walk(&m, &s, "/").await;
    let d = match m.handle(&s, ManagerRequest::Mkdir { parent, name: "d".into(), mode: 0o755 }).await {
        Ok(ManagerReply::Entry(e)) => e.handle(),
        other => panic!("{other:?}"),
    };
    // 300 entries of ~4.4 KB: more than one message holds, fewer than one page.
    const LINKS: usize = 300;
    let target = "t".repeat(SYMLINK_TARGET_MAX);
    for i in 0..LINKS {
        let req = ManagerRequest::Symlink { parent: d, name: format!("l{i:04}"), target: target.clone() };
        m.handle(&s, req).await.expect("symlink");
    }
    let (mut names, mut after, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let reply = m.handle(&s, ManagerRequest::ReadDir { dir: d, after: after.clone(), limit: 1024 }).await.unwrap();
        // The server asserts this before writing; over it, the session would panic.
        assert!(reply.encode(1).len() <= MANAGER_MESSAGE_MAX, "page {pages} is over MANAGER_MESSAGE_MAX");
        pages += 1;
        let ManagerReply::Dir { entries, more } = reply else { panic!("not a Dir reply") };
        assert!(!entries.is_empty());
        after = entries.last().unwrap().0.clone();
        names.extend(entries.into_iter().map(|(n, e)| {
            assert_eq!(e.target.len(), SYMLINK_TARGET_MAX, "targets are still listed");
            n
        }));
        if !more {
            break;
        }
    }
    assert!(pages >= 2, "the listing needed more than one page");
    assert_eq!(names, (0..LINKS).map(|i| format!("l{i:04}")).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn password_hashing_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = Vec::new();
    for _ in 0..4 * ARGON2_CONCURRENT_MAX {
        let (m, running, most) = (m.clone(), running.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            m.argon2(move |_memory| {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
                running.fetch_sub(1, Ordering::SeqCst);
            })
            .await
            .unwrap()
        }));
    }
    // Callers that give up (a login timing out) do not free their slot early.
    tokio::time::sleep(Duration::from_millis(5)).await;
    for t in tasks.iter().take(ARGON2_CONCURRENT_MAX) {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    let most = most.load(Ordering::SeqCst);
    assert!((1..=ARGON2_CONCURRENT_MAX).contains(&most), "{most} hashes ran at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_free_uid_does_not_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    // u32::MAX is no user's: it marks the manager's own write transactions.
    let refused = m.add_user("nobody", "password", nasd_meta::MANAGER_WRITER_UID, 1, false).await;
    assert_eq!(refused.expect_err("uid u32::MAX").status, FsStatus::InvalidArgument);
    m.add_user("top", "password", u32::MAX - 1, 1, false).await.unwrap();
    let req = ManagerRequest::AddUser {
        name: "next".into(),
        password: "password".into(),
        uid: 0,
        gid: 0,
        admin: false,
        groups: vec![],
    };
    let e = m.handle(&root(), req).await.expect_err("no uid above u32::MAX - 1");
    assert_eq!(e.status, FsStatus::InvalidArgument, "{e}");
    assert!(e.message.contains("give one explicitly"), "{e}");
}

/// An administrator's change of a user's groups reaches the user's open
/// sessions at their next request; a session whose user is gone ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_pick_up_group_changes() {
    let dir = tempfile::tempdir().unwrap();
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    m.add_user_in_groups("gus", "password", 1500, 1500, &[10, 20], false).await.unwrap();
    let mut gus = m.open_session("gus", "password").await.unwrap();
    assert_eq!(gus.caller, Caller { uid: 1500, gid: 1500, groups: vec![10, 20], role: 0 });
    let set = ManagerRequest::SetUserGroups { name: "gus".into(), groups: vec![30] };
    let e = m.handle(&gus, set.clone()).await.expect_err("administrators only");
    assert_eq!(e.status, FsStatus::NotAdmin);
    m.refresh_session(&mut gus).await.unwrap();
    assert_eq!(gus.caller.groups, vec![10, 20], "nothing changed: nothing reloaded");
    m.handle(&root(), set).await.unwrap();
    m.refresh_session(&mut gus).await.unwrap();
    assert_eq!(gus.caller, Caller { uid: 1500, gid: 1500, groups: vec![30], role: 0 });
    let unordered = ManagerRequest::SetUserGroups { name: "gus".into(), groups: vec![3, 2] };
    assert_eq!(m.handle(&root(), unordered).await.unwrap_err().status, FsStatus::InvalidArgument);
    let nobody = ManagerRequest::SetUserGroups { name: "nobody".into(), groups: vec![] };
    assert_eq!(m.handle(&root(), nobody).await.unwrap_err().status, FsStatus::NotFound);
    let mut ghost = Session { user: "ghost".into(), users_epoch: 0, ..gus.clone() };
    assert_eq!(m.refresh_session(&mut ghost).await.unwrap_err().status, FsStatus::NotLoggedIn);
}

/// `AS_USER`: a gateway acts for the callers its grant covers, as them
/// (permissions, ownership), with its own handles; nobody else may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_act_for_the_ids_of_their_grant_only() {
    let dir = tempfile::tempdir().unwrap();
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    m.add_user("gw", "password", 900, 900, false).await.unwrap();
    let mut gw = m.open_session("gw", "password").await.unwrap();
    let as_user = |uid: u32, gid: u32, groups: Vec<u32>, request: ManagerRequest| ManagerRequest::AsUser {
        uid,
        gid,
        groups,
        request: Box::new(request),
    };
    let mkdir = |parent: Handle, name: &str, mode: u32| ManagerRequest::Mkdir { parent, name: name.into(), mode };
    m.handle(&root(), mkdir(walk(&m, &root(), "/").await, "shared", 0o777)).await.unwrap();
    m.handle(&root(), mkdir(walk(&m, &root(), "/").await, "private", 0o700)).await.unwrap();
    let shared = walk(&m, &gw, "/shared").await;
    let e = m.handle(&gw, as_user(1000, 1000, vec![], mkdir(shared, "a", 0o755))).await.unwrap_err();
    assert_eq!(e.status, FsStatus::NotPermitted, "not a gateway: {e}");

    m.set_gateway("gw", Some((1000, 2000))).await.unwrap();
    m.refresh_session(&mut gw).await.unwrap();
    let Ok(ManagerReply::Entry(a)) = m.handle(&gw, as_user(1000, 1500, vec![1999], mkdir(shared, "a", 0o755))).await
    else {
        panic!("mkdir as uid 1000")
    };
    assert_eq!((a.attr.uid, a.attr.gid), (1000, 1500), "made as the caller it names");
    // The reply's handle is the gateway's: good for the gateway, as itself and for any of its callers.
    let as_gw = m.handle(&gw, ManagerRequest::GetAttr { handle: a.handle(), open: OpenMode::None }).await;
    assert!(as_gw.is_ok(), "{as_gw:?}");
    let e = m.handle(&gw, as_user(1001, 1001, vec![], mkdir(a.handle(), "b", 0o755))).await.unwrap_err();
    assert_eq!(e.status, FsStatus::PermissionDenied, "uid 1001 may not write in uid 1000's 0755 directory");
    m.handle(&gw, as_user(1000, 1000, vec![], mkdir(a.handle(), "b", 0o755))).await.unwrap();
    // A 0700 directory of root's: the callers are not root.
    let private = walk(&m, &gw, "/private").await;
    let e = m.handle(&gw, as_user(1000, 1000, vec![], mkdir(private, "x", 0o755))).await.unwrap_err();
    assert_eq!(e.status, FsStatus::PermissionDenied);
    // Outside the grant: the uid, the gid or any group.
    for (uid, gid, groups) in
        [(0, 1000, vec![]), (999, 1000, vec![]), (1000, 0, vec![]), (1000, 1000, vec![1001, 2001])]
    {
        let e = m.handle(&gw, as_user(uid, gid, groups.clone(), mkdir(shared, "c", 0o755))).await.unwrap_err();
        assert_eq!(e.status, FsStatus::NotPermitted, "{uid} {gid} {groups:?}: {e}");
    }
    // Handles are still checked, and bound to the gateway's user.
    let roots = walk(&m, &root(), "/shared").await;
    let e = m.handle(&gw, as_user(1000, 1000, vec![], mkdir(roots, "c", 0o755))).await.unwrap_err();
    assert_eq!(e.status, FsStatus::BadHandle);
    // Only name-space and file requests may be wrapped.
    let admin_req = ManagerRequest::ListUsers;
    let e = m.handle(&gw, as_user(1000, 1000, vec![], admin_req)).await.unwrap_err();
    assert_eq!(e.status, FsStatus::BadRequest);
    // The grant taken away reaches the open session.
    m.set_gateway("gw", None).await.unwrap();
    m.refresh_session(&mut gw).await.unwrap();
    let e = m.handle(&gw, as_user(1000, 1000, vec![], mkdir(shared, "d", 0o755))).await.unwrap_err();
    assert_eq!(e.status, FsStatus::NotPermitted);
}

/// A `WATCH` that does not wait: (incarnation, next, lost, changes).
async fn watch(
    m: &Manager,
    s: &Session,
    incarnation: u64,
    after: u64,
) -> (u64, u64, bool, Vec<nasd_proto::manager::Change>) {
    match m.handle(s, ManagerRequest::Watch { incarnation, after, wait_ms: 0 }).await {
        Ok(ManagerReply::Changes { incarnation, next, lost, changes }) => (incarnation, next, lost, changes),
        other => panic!("watch: {other:?}"),
    }
}

/// `WATCH` reports what requests changed; a session that is neither an
/// administrator nor a gateway sees names only in directories it may read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_change_feed_reports_changes_and_hides_names_from_those_who_may_not_read_them() {
    use nasd_proto::manager::Change;
    let dir = tempfile::tempdir().unwrap();
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    m.add_user("al", "password", 1000, 1000, false).await.unwrap();
    let al = m.open_session("al", "password").await.unwrap();
    let (inc, start, lost, _) = watch(&m, &al, 0, 0).await;
    assert!(lost, "a new watcher learns where the feed is");
    let top = walk(&m, &root(), "/").await;
    let mkdir = |parent: Handle, name: &str, mode: u32| ManagerRequest::Mkdir { parent, name: name.into(), mode };
    let Ok(ManagerReply::Entry(secret)) = m.handle(&root(), mkdir(top, "secret", 0o700)).await else { panic!() };
    m.handle(&root(), mkdir(secret.handle(), "inside", 0o700)).await.unwrap();
    let set = ManagerRequest::SetAttr {
        handle: secret.handle(),
        mask: nasd_proto::manager::set_mask::MODE,
        mode: 0o711,
        uid: 0,
        gid: 0,
        size: 0,
        atime_ns: 0,
        mtime_ns: 0,
    };
    m.handle(&root(), set).await.unwrap();
    let refused = m.handle(&al, mkdir(walk(&m, &al, "/").await, "nope", 0o755)).await;
    assert!(refused.is_err(), "a refused request changes nothing");
    let entry = |dir: u64, name: &str| Change::Entry { dir, name: name.into() };
    let (_, next, lost, all) = watch(&m, &root(), inc, start).await;
    assert!(!lost);
    let s = secret.attr.ino;
    let want = vec![entry(1, "secret"), Change::Inode(1), entry(s, "inside"), Change::Inode(s), Change::Inode(s)];
    assert_eq!(all, want, "an administrator sees every change");
    let (_, al_next, _, seen) = watch(&m, &al, inc, start).await;
    assert_eq!(al_next, next);
    let hidden = vec![entry(1, "secret"), Change::Inode(1), Change::Inode(s), Change::Inode(s), Change::Inode(s)];
    assert_eq!(seen, hidden, "no read permission on /secret: its names stay hidden");
    let (_, _, _, none) = watch(&m, &al, inc, next).await;
    assert!(none.is_empty());
}

#[test]
fn the_longest_login_is_exactly_login_message_max() {
    use nasd_proto::manager::{LOGIN_MESSAGE_MAX, PASSWORD_MAX, USER_NAME_MAX};
    let login = ManagerRequest::Login {
        version: nasd_proto::manager::MANAGER_PROTOCOL_VERSION,
        user: "u".repeat(USER_NAME_MAX),
        password: "p".repeat(PASSWORD_MAX),
    };
    login.check_limits().expect("within the limits");
    assert_eq!(login.encode(u64::MAX).len(), LOGIN_MESSAGE_MAX);
}

/// A drive the manager knows (in memory only) at `addr`, with fresh keys.
fn attach_drive(m: &Manager, drive: u32, addr: String) -> Arc<crate::drives::DriveHandle> {
    let keys = crate::keys::DriveKeys::generate(nasd_env::clock::system_ns() / 1_000_000_000);
    let mut drive_id = [0u8; 16];
    drive_id[..4].copy_from_slice(&drive.to_le_bytes());
    let rec = nasd_meta::DriveRecord {
        drive,
        drive_id,
        addr,
        partition: m.config.partition,
        sealed_keys: keys.seal(&m.kek, drive),
        capacity_bytes: 1 << 30,
        failure_domain: String::new(),
        state: nasd_meta::DriveState::In,
    };
    m.attach(&rec, keys)
}

/// A listener that accepts connections, counts them and closes them at
/// once: a drive whose every call fails.
async fn closing_listener() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(socket);
        }
    });
    (addr, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_drive_is_retried_with_backoff_not_every_pass() {
    let dir = tempfile::tempdir().unwrap();
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    let (addr, accepted) = closing_listener().await;
    let d = attach_drive(&m, 0, addr);
    assert!(!d.recovered());

    // The first pass tries the drive, fails, and backs off.
    let before = tokio::time::Instant::now();
    m.maintain().await;
    let tried = accepted.load(Ordering::SeqCst);
    assert!(tried >= 1, "the first pass tried the drive");
    let b = m.backoff(0);
    assert!(!b.ready(before), "a failed drive is not retried at once: {b:?}");
    assert!(b.ready(before + crate::maintenance::DRIVE_RETRY_MAX + Duration::from_secs(1)), "bounded: {b:?}");

    // While it backs off, passes still try to give it its pending working key
    // (capabilities are minted with the previous key until it lands)...
    m.drive_backoff
        .lock()
        .unwrap()
        .get_mut(&0)
        .unwrap()
        .failed(tokio::time::Instant::now() + Duration::from_secs(3600));
    assert!(d.key_pending());
    m.maintain().await;
    let tried_key = accepted.load(Ordering::SeqCst);
    assert!(tried_key > tried, "a pending working key is retried every pass, whatever the backoff");
    let tried = tried_key;

    // ...and leave it alone otherwise (no connection at all).
    d.set_keys_installed(d.keys());
    for _ in 0..3 {
        m.maintain().await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), tried, "passes during the backoff did not touch the drive");

    assert_eq!(m.backoff(0).failures(), 2);

    // Once due, it is tried again.
    m.drive_backoff.lock().unwrap().insert(0, Default::default());
    m.maintain().await;
    assert!(accepted.load(Ordering::SeqCst) > tried, "tried again once due");
    assert_eq!(m.backoff(0).failures(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_drive_refuses_more_than_drives_max_and_statfs_still_encodes() {
    use nasd_proto::manager::DRIVES_MAX;
    let dir = tempfile::tempdir().unwrap();
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    // Nothing listens on port 1: every drive is offline and answers at once.
    for drive in 0..DRIVES_MAX as u32 {
        attach_drive(&m, drive, "127.0.0.1:1".into());
    }
    let (addr, accepted) = closing_listener().await;
    let e = m.add_drive(&addr, &nasd_crypto::Key::random()).await.expect_err("one drive too many");
    assert_eq!(e.status, FsStatus::NoSpace, "{e}");
    assert!(e.message.contains("DRIVES_MAX"), "{e}");
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "refused before contacting the drive");

    let reply = m.handle(&root(), ManagerRequest::StatFs).await.expect("statfs");
    let ManagerReply::StatFs { drives, .. } = &reply else { panic!("{reply:?}") };
    assert_eq!(drives.len(), DRIVES_MAX);
    assert!(drives.iter().all(|d| !d.online));
    assert!(reply.encode(1).len() <= MANAGER_MESSAGE_MAX);

    let long = "a".repeat(nasd_proto::manager::DRIVE_ADDR_MAX + 1);
    let e = m.add_drive(&long, &nasd_crypto::Key::random()).await.expect_err("address too long");
    assert_eq!(e.status, FsStatus::InvalidArgument, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_are_minted_with_a_key_the_drive_holds() {
    let dir = tempfile::tempdir().unwrap();
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    let d = attach_drive(&m, 0, "127.0.0.1:1".into());
    // Before the first rotation there is only the key the drive was set up with.
    assert!(d.key_pending());
    assert_eq!(d.minting_key().0, 1);
    // A rotation the drive has not confirmed: the previous key, which it holds
    // as current (never told) or previous (told, unconfirmed).
    let next = d.keys().rotated(nasd_env::clock::system_ns() / 1_000_000_000);
    d.set_keys(next.clone());
    assert_eq!(d.minting_key().0, 1);
    assert_eq!(d.minting_key().1.expose(), next.previous.1.expose());
    d.set_keys_installed(next.clone());
    assert_eq!(d.minting_key().0, 2);
    assert_eq!(d.minting_key().1.expose(), next.current.1.expose());
    // rotate() will not go past a key still pending: it would retire the one minted with.
    d.set_keys(next.rotated(nasd_env::clock::system_ns() / 1_000_000_000));
    let e = m.rotate(&d).await.expect_err("the pending key cannot be installed on an absent drive");
    assert_eq!(e.status, FsStatus::DriveUnavailable, "{e}");
    assert_eq!(d.keys().current.0, 3, "no further rotation recorded");
}

/// Capabilities that allow writing demand data integrity — every write's
/// data MACed — whatever the client is configured with, unless the
/// administrator lowers it; read and attribute capabilities keep the
/// manager's general minimum.
#[tokio::test]
async fn write_capabilities_demand_data_integrity_unless_lowered() {
    use crate::drives::{ATTR_RIGHTS, READ_RIGHTS, WRITE_RIGHTS};
    let data = Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA);
    for (write_protection, writes_need_data) in
        [(crate::WRITE_PROTECTION_DEFAULT, true), (Protection::INTEGRITY_ARGS, false)]
    {
        let dir = tempfile::tempdir().unwrap();
        let m = Manager::open(dir.path(), ManagerConfig { write_protection, ..Default::default() }).unwrap();
        let d = attach_drive(&m, 0, "127.0.0.1:1".into());
        for (rights, needs_data) in [
            (WRITE_RIGHTS, writes_need_data),
            (READ_RIGHTS | WRITE_RIGHTS, writes_need_data),
            (nasd_proto::rights::APPEND, writes_need_data),
            (READ_RIGHTS, false),
            (ATTR_RIGHTS, false),
        ] {
            let access = d.mint(16, 1, rights, Duration::from_secs(30), 0, 0);
            let min = d.min_protection(rights);
            assert_eq!(min.covers(data), needs_data, "rights {rights:#x}, write minimum {write_protection:?}");
            let args = nasd_proto::CapabilityArgs::decode(&access.token).unwrap();
            assert_eq!(args.min_protection, min, "the drive enforces what the client is told");
        }
    }
}

/// The administrator may lower data integrity for writes on one partition
/// (one drive's) and no other: the waived drive's write capabilities demand
/// only the general minimum, every other drive's keep data integrity.
#[tokio::test]
async fn write_data_integrity_is_waived_only_on_the_partitions_named() {
    use crate::drives::WRITE_RIGHTS;
    let data = Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA);
    let dir = tempfile::tempdir().unwrap();
    let config = ManagerConfig { write_integrity_waived: [1].into_iter().collect(), ..Default::default() };
    let m = Manager::open(dir.path(), config).unwrap();
    let kept = attach_drive(&m, 0, "127.0.0.1:1".into());
    let waived = attach_drive(&m, 1, "127.0.0.1:2".into());
    assert_eq!(waived.drive, 1, "drive numbers as the configuration names them");
    for (d, needs_data) in [(&kept, true), (&waived, false)] {
        let access = d.mint(16, 1, WRITE_RIGHTS, Duration::from_secs(30), 0, 0);
        let args = nasd_proto::CapabilityArgs::decode(&access.token).unwrap();
        assert_eq!(args.min_protection.covers(data), needs_data, "drive {}", d.drive);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requested_scrub_shows_as_under_way_until_a_pass_has_run() {
    use nasd_proto::manager::RepairAction;
    let dir = tempfile::tempdir().unwrap();
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    let (addr, accepted) = closing_listener().await;
    attach_drive(&m, 0, addr);
    assert_eq!(m.cluster_status().await.unwrap().scrub.files_total, 0, "no scrub yet");

    // No repair loop runs here: between the request and a pass, whoever asked
    // sees its scrub under way, not the last one's result as if it were its own.
    m.request_repair(RepairAction::Scrub);
    let s = m.cluster_status().await.unwrap();
    assert_eq!((s.scrub.files_done, s.scrub.files_total), (0, 1), "{s:?}");
    m.request_repair(RepairAction::Scrub);
    assert_eq!(m.cluster_status().await.unwrap().scrub.files_total, 1, "asked twice: still one scrub shown");

    // The pass (whose drive fails) ends it.
    m.repair_pass().await;
    assert!(accepted.load(Ordering::SeqCst) >= 1, "the pass tried to scrub the drive");
    let s = m.cluster_status().await.unwrap();
    assert_eq!(s.scrub.files_total, 0, "{s:?}");
}

/// `nasd repair rebuild` follows the round it asked for by polling
/// `CLUSTER_STATUS` until the rebuild progress reads finished. Between the
/// request and the end of the repair pass that takes it, the progress never
/// reads finished (it used to read "nothing to do" until the pass had begun,
/// so `nasd repair` could return before the rebuild started); once that pass
/// is over, it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requested_rebuild_shows_until_the_pass_that_takes_it_has_ended() {
    use nasd_proto::manager::{Progress, RepairAction};
    let dir = tempfile::tempdir().unwrap();
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    let finished = |p: Progress| p.files_total == 0 || p.files_done >= p.files_total;
    assert!(finished(m.cluster_status().await.unwrap().rebuild), "nothing asked, nothing running");
    let reply = m.handle(&root(), ManagerRequest::Repair { action: RepairAction::Rebuild }).await.unwrap();
    assert!(matches!(reply, ManagerReply::Done), "{reply:?}");
    let pending = m.cluster_status().await.unwrap().rebuild;
    assert!(!finished(pending), "asked and no pass has run yet: not finished ({pending:?})");
    m.repair_pass().await;
    let after = m.cluster_status().await.unwrap().rebuild;
    assert_eq!(after, Progress::default(), "the pass that took the request has ended");
}
