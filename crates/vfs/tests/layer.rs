//! The file-system layer on a real cluster (drives with security enforced,
//! the TLS manager on loopback), without any gateway: persistent handles
//! reopened by a new layer of another process's making (a gateway restart),
//! refused for another user or when forged; atomic replacement seen whole
//! or not at all, and its `no_clobber`; a directory cursor that goes on
//! through concurrent creates and removals, with the changes' order and
//! the page positions drawn from a seed (`NASD_TEST_SEED`); an open file
//! unlinked and replaced by a rename, read on through its descriptor;
//! absent names answered by the layer once the manager said so, through
//! its own and another client's changes in a seeded order, never for a
//! name the manager refuses.

#[path = "../../fs/tests/common/mod.rs"]
mod common;

use common::*;
use nasd_fs::{FsClient, ROOT_INO};
use nasd_vfs::{CreateFlags, PersistentHandle, Vfs, VfsConfig, VfsError};
use std::collections::BTreeSet;

/// `O_CREAT|O_EXCL|O_WRONLY`.
const EXCLUSIVE_WRITE: CreateFlags = CreateFlags { exclusive: true, truncate: false, write: true };

/// A layer without the change feed (as a short command runs it).
async fn layer(fs: &FsClient) -> Vfs {
    to(Vfs::start(fs.clone(), VfsConfig { follow_feed: false, ..VfsConfig::default() })).await.expect("start")
}

/// User A logged in, a layer over its client, and A's directory `/a`
/// (made by the administrator) that the test works in.
async fn home(cluster: &Cluster) -> (FsClient, Vfs, u64) {
    let admin = cluster.login(ADMIN, ADMIN_PW).await;
    to(admin.mkdir("/a", 0o755)).await.expect("mkdir /a");
    to(admin.chown("/a", Some(UID_A), Some(UID_A))).await.expect("chown /a");
    let a = cluster.login(USER_A, PW_A).await;
    let vfs = layer(&a).await;
    let home = to(vfs.lookup(&a, ROOT_INO, "a")).await.expect("lookup /a").attr.ino;
    (a, vfs, home)
}

/// The test's seed: `NASD_TEST_SEED`, else the clock (printed).
fn seed() -> u64 {
    let seed = std::env::var("NASD_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("NASD_TEST_SEED={seed}");
    seed
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

async fn read_all(vfs: &Vfs, fh: u64) -> Vec<u8> {
    to(vfs.read(fh, 0, 1 << 20)).await.expect("read")
}

#[test]
fn persistent_handles_reopen_after_a_restart_and_only_for_their_user() {
    run(async {
        let cluster = Cluster::start(ClusterOptions::default()).await;
        let (a, vfs, home) = home(&cluster).await;
        let (e, opened) = to(vfs.create(&a, home, "kept", 0o644, EXCLUSIVE_WRITE)).await.expect("create");
        to(vfs.write(opened.fh, 0, b"outlives the gateway")).await.expect("write");
        to(vfs.release(opened.fh)).await.expect("close commits");
        let stored = vfs.persistent_handle(e.attr.ino).expect("held").as_bytes().to_vec();
        assert_eq!(PersistentHandle::from_bytes(&stored).unwrap().ino(), e.attr.ino);
        drop(vfs);
        drop(a);

        // A new login and a new layer: nothing of the first is left but the bytes.
        let a = cluster.login(USER_A, PW_A).await;
        let vfs = layer(&a).await;
        assert!(matches!(vfs.handle_of(e.attr.ino), Err(VfsError::Stale(_))), "a new layer holds nothing");
        let again = to(vfs.open_persistent(&a, &stored)).await.expect("reopened by its bytes");
        assert_eq!(again.attr.ino, e.attr.ino);
        let opened = to(vfs.open(&a, again.attr.ino, false)).await.expect("open");
        assert_eq!(read_all(&vfs, opened.fh).await, b"outlives the gateway");
        to(vfs.release(opened.fh)).await.unwrap();

        // Another user's layer: the manager refuses the handle (its MAC is A's).
        let b = cluster.login(USER_B, PW_B).await;
        let vfs_b = layer(&b).await;
        let refused = to(vfs_b.open_persistent(&b, &stored)).await.expect_err("B may not use A's handle");
        assert_eq!(refused.errno(), 116, "ESTALE: {refused}");
        // A forged MAC, and bytes that are no handle.
        let mut forged = stored.clone();
        *forged.last_mut().unwrap() ^= 1;
        assert_eq!(to(vfs.open_persistent(&a, &forged)).await.expect_err("forged").errno(), 116);
        assert!(matches!(to(vfs.open_persistent(&a, b"nonsense")).await, Err(VfsError::BadHandle(_))));
        // The file removed: its handle names nothing.
        let home = to(vfs.lookup(&a, ROOT_INO, "a")).await.expect("lookup /a").attr.ino;
        to(vfs.unlink(&a, home, "kept")).await.expect("unlink");
        assert!(to(vfs.open_persistent(&a, &stored)).await.is_err(), "a removed file's handle is refused");
    });
}

#[test]
fn a_replacement_is_seen_whole_or_not_at_all() {
    run(async {
        let cluster = Cluster::start(ClusterOptions::default()).await;
        let (a, vfs, home) = home(&cluster).await;
        to(a.write_file("/a/doc", b"old contents")).await.expect("the old file");
        let temp = nasd_vfs::temp_name("doc");
        assert!(temp.starts_with(".doc.") && temp.ends_with(nasd_vfs::TEMP_SUFFIX), "{temp}");
        let r = to(vfs.begin_replace(&a, home, "doc", &temp, 0o600)).await.expect("begin");
        to(r.file().expect("open").write_at(0, b"new contents, longer than the old")).await.expect("write");
        // Before it is published the destination is the old file.
        assert_eq!(to(a.read_file("/a/doc")).await.unwrap(), b"old contents");
        assert!(to(r.publish(false)).await.expect("publish"), "published");
        assert_eq!(to(a.read_file("/a/doc")).await.unwrap(), b"new contents, longer than the old");
        let names: Vec<String> = to(a.names("/a")).await.unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["doc"], "no temporary name left");

        // no_clobber: the destination exists, so nothing is replaced and the temporary goes.
        let temp = nasd_vfs::temp_name("doc");
        let r = to(vfs.begin_replace(&a, home, "doc", &temp, 0o600)).await.expect("begin");
        to(r.file().unwrap().write_at(0, b"never seen")).await.unwrap();
        assert!(!to(r.publish(true)).await.expect("publish"), "left alone");
        assert_eq!(to(a.read_file("/a/doc")).await.unwrap(), b"new contents, longer than the old");
        // no_clobber onto a new name links it in place.
        let temp = nasd_vfs::temp_name("fresh");
        let r = to(vfs.begin_replace(&a, home, "fresh", &temp, 0o600)).await.expect("begin");
        to(r.file().unwrap().write_at(0, b"fresh")).await.unwrap();
        assert!(to(r.publish(true)).await.expect("publish"));
        assert_eq!(to(a.read_file("/a/fresh")).await.unwrap(), b"fresh");
        // Abandoned: nothing of it stays.
        let temp = nasd_vfs::temp_name("doc");
        let r = to(vfs.begin_replace(&a, home, "doc", &temp, 0o600)).await.expect("begin");
        to(r.abandon()).await.expect("abandon");
        let names: Vec<String> = to(a.names("/a")).await.unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["doc", "fresh"]);
    });
}

#[test]
fn a_directory_cursor_goes_on_through_concurrent_changes() {
    let mut x = seed() | 1;
    run(async move {
        let cluster = Cluster::start(ClusterOptions::default()).await;
        let (a, vfs, home) = home(&cluster).await;
        let dir = to(vfs.mkdir(&a, home, "d", 0o755)).await.expect("mkdir").attr.ino;
        // More than two pages (READDIR_ENTRIES_MAX each), so the cursor pages while names change.
        let total = nasd_fs::READDIR_ENTRIES_MAX as u64 * 5 / 2;
        let name = |i: u64| format!("n{i:05}");
        for i in 0..total {
            to(vfs.mknod(&a, dir, &name(i), None, 0o644, 0)).await.expect("create");
        }
        // Half of the names stay throughout; the rest are removed or added while listing.
        let stable: BTreeSet<String> = (0..total).filter(|i| i % 2 == 0).map(name).collect();
        let fh = vfs.opendir(dir).expect("opendir");
        let mut seen = Vec::new();
        let mut offset = nasd_vfs::FIRST_ENTRY;
        let mut extra = total;
        loop {
            // A batch as small as a gateway's buffer may hold: 1 to 40 entries.
            let room = 1 + next(&mut x) % 40;
            let mut got = 0;
            let mut last = None;
            to(vfs.readdir(&a, fh, offset, |next_offset, item| {
                if got == room {
                    return true;
                }
                seen.push(item.name.clone());
                got += 1;
                last = Some(next_offset);
                false
            }))
            .await
            .expect("readdir");
            let Some(after) = last else { break };
            offset = after;
            // Concurrent changes by the same user: a removal and an addition somewhere.
            let victim = next(&mut x) % total;
            if victim % 2 == 1 {
                let _ = to(vfs.unlink(&a, dir, &name(victim))).await;
            }
            to(vfs.mknod(&a, dir, &name(extra), None, 0o644, 0)).await.expect("create during the listing");
            extra += 1;
        }
        vfs.releasedir(fh);
        let listed: Vec<&String> = seen.iter().filter(|n| !n.starts_with('.')).collect();
        let unique: BTreeSet<&String> = listed.iter().copied().collect();
        assert_eq!(unique.len(), listed.len(), "no name listed twice");
        for n in &stable {
            assert!(unique.contains(n), "{n}, there throughout, was listed");
        }
        assert!(listed.windows(2).all(|w| w[0] < w[1]), "names in order");
    });
}

#[test]
fn an_open_file_lives_on_when_unlinked_or_replaced() {
    run(async {
        let cluster = Cluster::start(ClusterOptions::default()).await;
        let (a, vfs, home) = home(&cluster).await;
        let (e, w) = to(vfs.create(&a, home, "f", 0o644, EXCLUSIVE_WRITE)).await.expect("create");
        to(vfs.write(w.fh, 0, b"first")).await.unwrap();
        to(vfs.commit(w.fh)).await.unwrap();
        let r = to(vfs.open(&a, e.attr.ino, false)).await.expect("a second descriptor");
        // Replaced by a rename while open: the open file lives on under a hidden name.
        to(a.write_file("/a/g", b"second")).await.unwrap();
        let g = to(vfs.lookup(&a, home, "g")).await.unwrap();
        to(vfs.rename(&a, (home, "g"), (home, "f"))).await.expect("rename over the open file");
        assert_eq!(read_all(&vfs, r.fh).await, b"first", "read through the old descriptor");
        // A write through one descriptor is read through the other at once.
        to(vfs.write(w.fh, 5, b" and more")).await.unwrap();
        assert_eq!(read_all(&vfs, r.fh).await, b"first and more");
        let names: Vec<String> = to(a.names("/a")).await.unwrap().into_iter().map(|(n, _)| n).collect();
        assert!(names.iter().any(|n| n.starts_with(nasd_vfs::HIDDEN_PREFIX)), "{names:?}");
        assert_eq!(to(a.read_file("/a/f")).await.unwrap(), b"second");
        // Unlinked too: the last close removes the hidden name.
        to(vfs.release(w.fh)).await.expect("close");
        to(vfs.release(r.fh)).await.expect("last close");
        let names: Vec<String> = to(a.names("/a")).await.unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["f"], "the hidden name went with the last close");
        vfs.forget(g.attr.ino, 1);
    });
}

/// Looks `name` up in `dir` until the layer finds it (the change feed
/// reported another client's name); panics if it never does.
async fn found_eventually(vfs: &Vfs, a: &FsClient, dir: u64, name: &str) {
    for _ in 0..600 {
        match to(vfs.lookup(a, dir, name)).await {
            Ok(e) => {
                vfs.forget(e.attr.ino, 1);
                return;
            }
            Err(e) if e.status() == Some(nasd_fs::FsStatus::NotFound) => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => panic!("lookup of {name}: {e}"),
        }
    }
    panic!("{name}, made by another client, is never found: the layer answers from stale absent names");
}

/// Looks `name` up in `dir`, expecting "no such name"; whether the layer
/// answered it without the manager.
async fn absent_answered_here(vfs: &Vfs, a: &FsClient, dir: u64, name: &str) -> bool {
    let hits = vfs.negative_hits();
    let e = to(vfs.lookup(a, dir, name)).await.expect_err("an absent name");
    assert_eq!(e.status(), Some(nasd_fs::FsStatus::NotFound), "{name}: {e}");
    vfs.negative_hits() > hits
}

/// Looks absent `name` up until the layer answers it without the manager
/// (a lookup that another client's change, or a batch of the feed not read
/// yet, overlapped is not taken in); panics if it never does.
async fn answered_here_eventually(vfs: &Vfs, a: &FsClient, dir: u64, name: &str) {
    for _ in 0..200 {
        if absent_answered_here(vfs, a, dir, name).await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("{name}: the manager's NOT_FOUND is never kept");
}

#[test]
fn absent_names_are_answered_here_only_while_the_feed_vouches_for_them() {
    let mut x = seed() | 1;
    run(async move {
        let cluster = Cluster::start(ClusterOptions::default()).await;
        let (a, _, _) = home(&cluster).await;
        let vfs = to(Vfs::start(a.clone(), VfsConfig::default())).await.expect("a layer following the feed");
        let home = to(vfs.lookup(&a, ROOT_INO, "a")).await.expect("lookup /a").attr.ino;
        let other = cluster.login(USER_A, PW_A).await;

        // A name the manager said is absent is answered here next time.
        assert!(!absent_answered_here(&vfs, &a, home, "later").await, "the first lookup asks the manager");
        answered_here_eventually(&vfs, &a, home, "later").await;
        to(other.write_file("/a/later", b"now")).await.expect("another client makes it");
        found_eventually(&vfs, &a, home, "later").await;

        // In a directory made here too; a name the manager refuses is asked of it every
        // time, and its error is the answer.
        let dir = to(vfs.mkdir(&a, home, "made", 0o755)).await.expect("mkdir").attr.ino;
        for i in 0..20 {
            let name = format!("never-{i}");
            assert!(!absent_answered_here(&vfs, &a, dir, &name).await, "{name}: asked first");
            answered_here_eventually(&vfs, &a, dir, &name).await;
        }
        let long = "n".repeat(nasd_proto::fs::FILE_NAME_MAX + 1);
        for _ in 0..2 {
            let e = to(vfs.lookup(&a, dir, &long)).await.expect_err("a name too long");
            assert_eq!(e.status(), Some(nasd_fs::FsStatus::NameTooLong), "{e}");
        }
        let longest = "n".repeat(nasd_proto::fs::FILE_NAME_MAX);
        assert!(!absent_answered_here(&vfs, &a, dir, &longest).await);
        answered_here_eventually(&vfs, &a, dir, &longest).await;
        let hits = vfs.negative_hits();
        for bad in ["a/b", ".", "..", "a/b", ".", ".."] {
            if let Err(e) = to(vfs.lookup(&a, dir, bad)).await {
                assert_ne!(e.status(), Some(nasd_fs::FsStatus::NotFound), "{bad}: {e}");
            }
        }
        assert_eq!(vfs.negative_hits(), hits, "names the manager refuses are never answered here");

        // This layer's creates, links, renames and unlinks, and another client's creates
        // and unlinks, in a seeded order: every name that exists is found, every name
        // removed is absent.
        let mut mine: Vec<String> = Vec::new();
        let mut theirs: Vec<String> = Vec::new();
        for step in 0..40 {
            match next(&mut x) % 5 {
                0 => {
                    let name = format!("mine-{step}");
                    // Asked twice first (the second answered here unless another client's
                    // change to the directory came between): the create is seen at once.
                    absent_answered_here(&vfs, &a, dir, &name).await;
                    absent_answered_here(&vfs, &a, dir, &name).await;
                    let (e, opened) = to(vfs.create(&a, dir, &name, 0o644, EXCLUSIVE_WRITE)).await.expect("create");
                    to(vfs.release(opened.fh)).await.expect("close");
                    vfs.forget(e.attr.ino, 1);
                    mine.push(name);
                }
                1 if !mine.is_empty() => {
                    let name = mine.remove((next(&mut x) % mine.len() as u64) as usize);
                    to(vfs.unlink(&a, dir, &name)).await.expect("unlink");
                    assert!(!absent_answered_here(&vfs, &a, dir, &name).await, "{name} was made here: asked");
                    if next(&mut x).is_multiple_of(2) {
                        // The other client makes the name again at once.
                        to(other.write_file(&format!("/a/made/{name}"), b"again")).await.expect("made again");
                        found_eventually(&vfs, &a, dir, &name).await;
                        theirs.push(name);
                    }
                }
                2 if !mine.is_empty() => {
                    // A link or a rename here: the new name is found at once.
                    let from = mine[(next(&mut x) % mine.len() as u64) as usize].clone();
                    let to_name = format!("moved-{step}");
                    let e = to(vfs.lookup(&a, dir, &from)).await.expect("lookup");
                    if next(&mut x).is_multiple_of(2) {
                        let l = to(vfs.link(&a, e.attr.ino, dir, &to_name)).await.expect("link");
                        vfs.forget(l.attr.ino, 1);
                    } else {
                        to(vfs.rename(&a, (dir, &from), (dir, &to_name))).await.expect("rename");
                        mine.retain(|n| *n != from);
                    }
                    vfs.forget(e.attr.ino, 1);
                    mine.push(to_name);
                }
                3 => {
                    let name = format!("theirs-{step}");
                    to(other.write_file(&format!("/a/made/{name}"), b"theirs")).await.expect("their create");
                    found_eventually(&vfs, &a, dir, &name).await;
                    theirs.push(name);
                }
                _ if !theirs.is_empty() => {
                    let name = theirs.remove((next(&mut x) % theirs.len() as u64) as usize);
                    to(other.unlink(&format!("/a/made/{name}"))).await.expect("their unlink");
                    let gone = to(vfs.lookup(&a, dir, &name)).await.expect_err("their unlink");
                    assert_eq!(gone.status(), Some(nasd_fs::FsStatus::NotFound));
                }
                _ => {}
            }
            for name in mine.iter().chain(&theirs) {
                let e = to(vfs.lookup(&a, dir, name)).await.unwrap_or_else(|e| panic!("{name} exists: {e}"));
                vfs.forget(e.attr.ino, 1);
            }
        }
    });
}
