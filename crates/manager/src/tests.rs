//! Manager unit tests that need no drive: configuration checks, request
//! limits, password hashing bounds.

use crate::service::Session;
use crate::{Manager, ManagerConfig, ARGON2_CONCURRENT_MAX};
use nasd_meta::Caller;
use nasd_proto::fs::{FsStatus, SYMLINK_TARGET_MAX};
use nasd_proto::manager::{Handle, ManagerReply, ManagerRequest, OpenMode, MANAGER_MESSAGE_MAX};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn root() -> Session {
    Session { user: "root".into(), caller: Caller::ROOT, admin: true }
}

/// The handle `s` gets for `path` by walking to it.
async fn walk(m: &Manager, s: &Session, path: &str) -> Handle {
    match m.handle(s, ManagerRequest::Walk { path: path.into(), follow: false, open: OpenMode::None }).await {
        Ok(ManagerReply::Entry(e)) => e.handle,
        other => panic!("walk {path}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_are_checked_before_anything_else_and_bound_to_the_user() {
    let dir = tempfile::tempdir().unwrap();
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    let s = root();
    let alice = Session { user: "alice".into(), caller: Caller { uid: 1000, gid: 1000 }, admin: false };
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
        Ok(ManagerReply::Entry(e)) => e.handle,
        other => panic!("{other:?}"),
    };
    let moved = Handle { ino: made.ino, mac: root_dir.mac };
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
        Ok(ManagerReply::Entry(e)) => e.handle,
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
            m.argon2(move || {
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
    assert!(most >= 1 && most <= ARGON2_CONCURRENT_MAX, "{most} hashes ran at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_free_uid_does_not_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let m = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    m.add_user("top", "password", u32::MAX, 1, false).await.unwrap();
    let req =
        ManagerRequest::AddUser { name: "next".into(), password: "password".into(), uid: 0, gid: 0, admin: false };
    let e = m.handle(&root(), req).await.expect_err("no uid above u32::MAX");
    assert_eq!(e.status, FsStatus::InvalidArgument, "{e}");
}
