//! Client failover between real `nasd manager` processes on one PostgreSQL
//! database (a real server the test starts), over three real `nasd drive`
//! processes: a client given both managers (`FsConfig::failover`) runs a
//! burst of creates and renames; the manager it uses is SIGKILLed part-way.
//! The client moves to the other manager (the next request goes there), the
//! burst goes on, and every operation acknowledged before or after the kill
//! is there, read through the surviving manager; at most the operations in
//! flight at the kill fail, and they leave no half-made name behind that
//! the database does not explain.

mod common;

use common::cluster::{path_str, Cluster, Options};
use common::Daemon;
use nasd_fs::{FsClient, FsConfig};
use nasd_meta::testing::PgServer;
use std::ffi::OsString;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Operations of the burst (each: create and write a file, then rename it).
const FILES: usize = 60;
/// The manager in use is killed once this many files are acknowledged.
const KILL_AFTER: usize = 20;
/// Longest any step may take (a hang, not a timing assertion).
const STEP: Duration = Duration::from_secs(120);

/// What the burst saw of each file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acked {
    /// The create (and write) failed: it was in flight at the kill.
    Nothing,
    /// Written, the rename failed (in flight at the kill).
    Written,
    /// Written and renamed, both acknowledged.
    Renamed,
}

fn data(i: usize) -> Vec<u8> {
    (0..1000 + 37 * i).map(|j| (i * 31 + j * 7) as u8).collect()
}

#[test]
fn a_client_moves_to_another_manager_when_its_manager_is_sigkilled_mid_burst() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let url = server.fresh_url();
    let mut c = Cluster::start(Options { drives: 3, manager: format!("metadata = \"{url}\""), drive_args: Vec::new() });

    // The second manager: its own directory holding the first one's key and TLS files.
    let dir2 = c.dir().join("manager-2");
    std::fs::create_dir_all(dir2.join("tls")).unwrap();
    std::fs::copy(c.manager_dir.join(nasd_manager::KEK_FILE), dir2.join(nasd_manager::KEK_FILE)).unwrap();
    for f in std::fs::read_dir(c.manager_dir.join("tls")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), dir2.join("tls").join(f.file_name())).unwrap();
    }
    let (config, data2) = (c.config.clone(), dir2.clone());
    let mut m2 = Daemon::start("manager-2", c.dir(), &c.dir().join("manager-2.log"), None, move |addr| {
        vec![
            "--config".into(),
            config.clone().into(),
            "manager".into(),
            "--data".into(),
            OsString::from(path_str(&data2)),
            "--listen".into(),
            addr.to_string().into(),
        ]
    });
    let first = c.manager_addr.to_string();
    let second = m2.addr.to_string();

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let config = FsConfig { failover: vec![second.clone()], ..c.fs_config() };
        let fs = tokio::time::timeout(STEP, FsClient::connect(&config)).await.unwrap().expect("log in");
        assert_eq!(fs.current_manager(), first, "the first manager is used while it runs");
        tokio::time::timeout(STEP, fs.mkdir("/burst", 0o755)).await.unwrap().expect("mkdir");

        let acked = Arc::new(Mutex::new(vec![Acked::Nothing; FILES]));
        let done = Arc::new(AtomicUsize::new(0));
        let burst = {
            let (fs, acked, done) = (fs.clone(), acked.clone(), done.clone());
            tokio::spawn(async move {
                let mut failed = Vec::new();
                for i in 0..FILES {
                    let (from, to) = (format!("/burst/f{i}"), format!("/burst/g{i}"));
                    match tokio::time::timeout(STEP, fs.write_file(&from, &data(i))).await.unwrap() {
                        Ok(_) => acked.lock().unwrap()[i] = Acked::Written,
                        Err(e) => {
                            failed.push(format!("write {from}: {e}"));
                            done.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                    }
                    match tokio::time::timeout(STEP, fs.rename(&from, &to)).await.unwrap() {
                        Ok(()) => acked.lock().unwrap()[i] = Acked::Renamed,
                        Err(e) => failed.push(format!("rename {from}: {e}")),
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                }
                failed
            })
        };
        while done.load(Ordering::SeqCst) < KILL_AFTER {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        c.kill_manager();
        let failed = tokio::time::timeout(STEP, burst).await.unwrap().expect("the burst task");
        eprintln!("operations that failed at the kill: {failed:?}");
        // The one operation in flight at the kill (its create and write, or its
        // rename) may fail; everything after it goes to the other manager.
        assert!(failed.len() <= 1, "more than the operation in flight failed: {failed:?}\n{}", c.logs());
        assert_eq!(fs.current_manager(), second, "the client moved to the other manager");

        // Everything acknowledged is there, through the surviving manager alone.
        let only_second = FsConfig { manager: second.clone(), failover: Vec::new(), ..c.fs_config() };
        let check = tokio::time::timeout(STEP, FsClient::connect(&only_second)).await.unwrap().expect("log in");
        let names: Vec<String> = tokio::time::timeout(STEP, check.readdir("/burst"))
            .await
            .unwrap()
            .expect("readdir")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let acked = acked.lock().unwrap().clone();
        let renamed = acked.iter().filter(|a| **a == Acked::Renamed).count();
        assert!(renamed >= FILES - 1, "{renamed} of {FILES} renamed: {acked:?}");
        for (i, a) in acked.iter().enumerate() {
            let (f, g) = (format!("f{i}"), format!("g{i}"));
            let (has_f, has_g) = (names.contains(&f), names.contains(&g));
            match a {
                Acked::Renamed => {
                    assert!(has_g && !has_f, "file {i} was renamed: {names:?}");
                    let back = tokio::time::timeout(STEP, check.read_file(&format!("/burst/{g}"))).await.unwrap();
                    assert!(back.expect("read") == data(i), "file {i} reads back through the other manager");
                }
                Acked::Written => assert!(has_f != has_g, "file {i} was written: under one name: {names:?}"),
                // Not acknowledged: it may or may not have been made, under its first name.
                Acked::Nothing => assert!(!has_g, "file {i} was never renamed: {names:?}"),
            }
        }
        drop((fs, check));
    });
    m2.terminate();
    drop(c);
    drop(server);
}
