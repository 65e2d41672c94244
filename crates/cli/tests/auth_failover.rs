//! Two authentication servers on one PostgreSQL database (a real server the
//! test starts), as an operator runs them: `nasd up --metadata postgres://…`
//! (its authentication server keeps its state in that database), `nasd
//! admin join-bundle` there, and a second server, a separate process, made
//! with `nasd auth --join BUNDLE`. Clients list both (`[client] auth`, then
//! `auth_failover`), the second first.
//!
//! - A key rotated through one server is the one the other issues; one
//!   retired through the other is refused by the first, and the drives
//!   follow (the manager syncs from its own server).
//! - Writers put files and read them back, each command logging in at the
//!   authentication servers, while the server they use is SIGKILLed at a
//!   point chosen from a printed seed: no command fails, every file reads
//!   back as written, and a rotation after the kill goes through the
//!   survivor.

use nasd_meta::testing::PgServer;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{free_addr, nasd_command, ok, Daemon};

/// Writers running at once.
const WRITERS: usize = 2;
/// Files each writer puts and reads back.
const FILES_EACH: usize = 12;

fn nasd(config: &Path, args: &[&str]) -> Output {
    nasd_command().arg("--config").arg(config).args(args).output().expect("run nasd")
}

/// `nasd up`'s config file with `[client]` logging in at `auth` first, then at `failover`.
fn client_config(data: &Path, out: &Path, auth: &str, failover: &[&str]) -> PathBuf {
    let text = std::fs::read_to_string(data.join("nasd.toml")).unwrap();
    let mut config: toml::Table = toml::from_str(&text).unwrap();
    let client = config.get_mut("client").and_then(|c| c.as_table_mut()).expect("[client]");
    client.insert("auth".into(), auth.into());
    client.insert("auth_failover".into(), toml::Value::Array(failover.iter().map(|&a| a.into()).collect()));
    std::fs::write(out, toml::to_string(&config).unwrap()).unwrap();
    out.to_path_buf()
}

/// The `[client] auth` `nasd up` recorded.
fn up_auth(data: &Path) -> String {
    let text = std::fs::read_to_string(data.join("nasd.toml")).unwrap();
    let config: toml::Table = toml::from_str(&text).unwrap();
    config["client"]["auth"].as_str().expect("[client] auth").to_string()
}

/// The key id `nasd auth login` reports for the identity it was issued.
fn login_key_id(config: &Path) -> u32 {
    let out = ok(nasd(config, &["auth", "login"]));
    let id = out.split("identity key id ").nth(1).and_then(|r| r.split(',').next()).expect("a key id");
    id.trim().parse().unwrap_or_else(|_| panic!("{out}"))
}

fn file_bytes(writer: usize, i: usize) -> Vec<u8> {
    let n = 1000 + (writer * 7919 + i * 104_729) % 60_000;
    (0..n).map(|j| (j * 31 + writer * 7 + i) as u8).collect()
}

#[test]
fn clients_fail_over_between_authentication_servers_on_one_database() {
    let seed = std::env::var("NASD_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("seed {seed} (NASD_TEST_SEED={seed} repeats this run)");
    let kill_after = 2 + (seed % (WRITERS * FILES_EACH / 2) as u64) as usize;
    println!("the second authentication server is killed after {kill_after} files");

    let pg = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let url = pg.fresh_url();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("cluster");
    std::fs::create_dir_all(&data).unwrap();
    let dir = data.clone();
    let url_up = url.clone();
    let mut up = Daemon::start("nasd up", &data, &tmp.path().join("up.log"), None, move |addr| {
        let mut args: Vec<OsString> =
            vec!["up".into(), "--data".into(), dir.clone().into(), "--drives".into(), "1".into()];
        args.extend(["--manager-port".into(), addr.port().to_string().into()]);
        args.extend(["--first-drive-port".into(), free_addr().port().to_string().into()]);
        args.extend(["--drive-capacity".into(), "64MiB".into(), "--metadata".into(), url_up.clone().into()]);
        args
    });
    let up_config = data.join("nasd.toml");
    assert!(!data.join("auth").join(nasd_auth::AUTH_DB).exists(), "the authentication state is in the database");
    ok(nasd(&up_config, &["mkdir", "/w"]));

    // The second server, from the bundle, in its own process.
    let bundle = tmp.path().join("join.toml");
    let made = ok(nasd(
        &up_config,
        &[
            "admin",
            "join-bundle",
            bundle.to_str().unwrap(),
            "--data",
            data.join("manager").to_str().unwrap(),
            "--metadata",
            &url,
        ],
    ));
    assert!(made.contains("nasd auth --join"), "{made}");
    let auth_b_dir = tmp.path().join("auth-b");
    let (bundle_arg, dir_b) = (bundle.clone(), auth_b_dir.clone());
    let mut auth_b = Daemon::start("auth-b", tmp.path(), &tmp.path().join("auth-b.log"), None, move |addr| {
        vec![
            "auth".into(),
            "--join".into(),
            bundle_arg.clone().into(),
            "--data".into(),
            dir_b.clone().into(),
            "--listen".into(),
            addr.to_string().into(),
        ]
    });
    assert!(auth_b.output().contains("state in postgres://"), "{}", auth_b.output());
    assert!(!auth_b_dir.join(nasd_auth::AUTH_DB).exists());
    assert!(!auth_b_dir.join("admin.password").exists(), "a joining server makes no administrator of its own");

    let (a, b) = (up_auth(&data), auth_b.addr.to_string());
    let at_a = client_config(&data, &tmp.path().join("at-a.toml"), &a, &[]);
    let at_b = client_config(&data, &tmp.path().join("at-b.toml"), &b, &[]);
    let both = client_config(&data, &tmp.path().join("both.toml"), &b, &[&a]);

    // Rotated through one, issued by the other; retired through the other, refused by the first.
    assert_eq!(login_key_id(&at_a), 1);
    let rotated = ok(nasd(&at_b, &["auth", "rotate-key"]));
    assert!(rotated.contains("shared key 2") && rotated.contains("every drive has the change"), "{rotated}");
    assert_eq!(login_key_id(&at_a), 2, "A issues the key rotated through B");
    ok(nasd(&at_a, &["auth", "retire-key", "2"]));
    assert_eq!(login_key_id(&at_b), 1, "B no longer issues the key retired through A");
    ok(nasd(&at_b, &["auth", "rotate-key"]));
    assert_eq!(login_key_id(&at_a), 3, "ids never repeat across servers");
    {
        // The manager's view (its link is A): an identity from B under a retired key is refused.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let token = nasd_crypto::read_key_file(&data.join("auth").join(nasd_auth::SERVICE_TOKEN_FILE)).unwrap();
        let ca = data.join("manager").join("tls").join("ca.pem");
        let tls = nasd_login::auth_client::connector(&ca).unwrap();
        rt.block_on(async {
            let mut at_b =
                nasd_login::auth_client::AuthClient::service_login(&b, "localhost", &tls, &token).await.unwrap();
            let (high, keys) = at_b.identity_keys().await.unwrap();
            assert_eq!((high, keys.iter().map(|k| k.key_id).collect::<Vec<_>>()), (3, vec![1, 3]));
        });
    }
    assert!(ok(nasd(&at_b, &["ls", "/"])).contains('w'), "an identity from B works at the manager");

    // Writers through both, B first; B is killed part-way.
    let local = tmp.path().join("local");
    std::fs::create_dir_all(&local).unwrap();
    let acked = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (both, local, acked, failed) = (both.clone(), local.clone(), acked.clone(), failed.clone());
            std::thread::spawn(move || {
                for i in 0..FILES_EACH {
                    let src = local.join(format!("{w}-{i}"));
                    std::fs::write(&src, file_bytes(w, i)).unwrap();
                    let remote = format!("/w/{w}-{i}");
                    let put = nasd(&both, &["put", src.to_str().unwrap(), &remote]);
                    if !put.status.success() {
                        failed.store(true, Ordering::SeqCst);
                        panic!("put {remote} failed: {}", String::from_utf8_lossy(&put.stderr));
                    }
                    acked.fetch_add(1, Ordering::SeqCst);
                    let back = local.join(format!("{w}-{i}.back"));
                    let get = nasd(&both, &["get", &remote, back.to_str().unwrap()]);
                    if !get.status.success() {
                        failed.store(true, Ordering::SeqCst);
                        panic!("get {remote} failed: {}", String::from_utf8_lossy(&get.stderr));
                    }
                    assert_eq!(std::fs::read(&back).unwrap(), file_bytes(w, i), "{remote} reads back as written");
                }
            })
        })
        .collect();
    while acked.load(Ordering::SeqCst) < kill_after && !failed.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(10));
    }
    auth_b.kill();
    for w in writers {
        w.join().expect("a writer's command failed");
    }
    assert_eq!(acked.load(Ordering::SeqCst), WRITERS * FILES_EACH);

    // After the kill: administration through the survivor, and every file as written.
    let rotated = ok(nasd(&both, &["auth", "rotate-key"]));
    assert!(rotated.contains("shared key 4"), "{rotated}");
    assert_eq!(login_key_id(&both), 4);
    let listing = ok(nasd(&at_a, &["ls", "/w"]));
    for w in 0..WRITERS {
        for i in 0..FILES_EACH {
            assert!(listing.contains(&format!("{w}-{i}")), "/w/{w}-{i} listed: {listing}");
        }
    }
    up.terminate();
}
