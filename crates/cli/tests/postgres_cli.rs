//! The real `nasd` binary with its metadata on PostgreSQL (a real server
//! the test starts): `nasd up --metadata postgres://…` serves files (put,
//! ls, get, mv, rm through the binary), records the location so a restart
//! finds the same files, refuses to move an existing cluster's metadata, and
//! `nasd admin reset-password --metadata` works on it (and resets the
//! password at `nasd up`'s authentication server too, which is where it logs in).

use nasd_meta::testing::{PgServer, PgServerOptions, PASSWORD_ROLE};
use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Output, Stdio};

mod common;

use common::{free_addr, nasd_command, ok, Daemon};

/// `nasd up` on `data` (one drive of 64 MiB), with `extra` arguments; the
/// drive's port is chosen at the first start only (then it is recorded).
fn up(data: &Path, log: &Path, extra: &[&str]) -> Daemon {
    up_with_env(data, log, extra, &[])
}

/// [`up`] with `env` added to its environment.
fn up_with_env(data: &Path, log: &Path, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
    let (dir, extra): (OsString, Vec<String>) = (data.into(), extra.iter().map(|s| s.to_string()).collect());
    Daemon::start_with_env("nasd up", data, log, None, env, move |addr| {
        let mut args: Vec<OsString> = vec!["up".into(), "--data".into(), dir.clone(), "--drives".into(), "1".into()];
        args.extend(["--manager-port".into(), addr.port().to_string().into()]);
        if !Path::new(&dir).join("nasd.toml").exists() {
            args.extend(["--first-drive-port".into(), free_addr().port().to_string().into()]);
        }
        args.extend(["--drive-capacity".into(), "64MiB".into()]);
        args.extend(extra.iter().map(OsString::from));
        args
    })
}

/// Runs `nasd ARGS` with the cluster's config file.
fn nasd(data: &Path, args: &[&str]) -> Output {
    nasd_command().arg("--config").arg(data.join("nasd.toml")).args(args).output().expect("run nasd")
}

#[test]
fn nasd_up_serves_files_with_its_metadata_on_postgres() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let url = server.fresh_url();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("cluster");
    std::fs::create_dir_all(&data).unwrap();
    let log = tmp.path().join("up.log");

    let mut d = up(&data, &log, &["--metadata", &url]);
    let out = d.output_once(&format!("metadata  {url}"));
    assert!(out.contains(&format!("metadata  {url}")), "the banner names the metadata:\n{out}");
    assert!(!data.join("manager").join(nasd_manager::META_DB).exists(), "no SQLite file beside PostgreSQL");
    let local = tmp.path().join("local.bin");
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&local, &bytes).unwrap();
    ok(nasd(&data, &["mkdir", "/docs"]));
    ok(nasd(&data, &["put", local.to_str().unwrap(), "/docs/a.bin"]));
    ok(nasd(&data, &["mv", "/docs/a.bin", "/docs/b.bin"]));
    assert!(ok(nasd(&data, &["ls", "/docs"])).contains("b.bin"));
    d.terminate();

    // A restart without --metadata uses the recorded location: the file is there.
    let mut d = up(&data, &log, &[]);
    let back = tmp.path().join("back.bin");
    ok(nasd(&data, &["get", "/docs/b.bin", back.to_str().unwrap()]));
    assert!(std::fs::read(&back).unwrap() == bytes, "the file reads back after a restart");
    ok(nasd(&data, &["rm", "/docs/b.bin"]));
    assert!(!ok(nasd(&data, &["ls", "/docs"])).contains("b.bin"));
    d.terminate();

    // The metadata of an existing cluster does not move.
    let other = server.fresh_url();
    let moved = Command::new(env!("CARGO_BIN_EXE_nasd"))
        .args(["up", "--data", data.to_str().unwrap(), "--metadata", &other])
        .env_remove("NASD_CONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!moved.status.success());
    assert!(String::from_utf8_lossy(&moved.stderr).contains("run without --metadata"), "{moved:?}");

    // The offline password reset finds the metadata through --metadata (or the config file).
    let manager_dir = data.join("manager");
    let reset = |metadata: &str| {
        Command::new(env!("CARGO_BIN_EXE_nasd"))
            .args(["admin", "reset-password", "admin", "--data", manager_dir.to_str().unwrap(), "--metadata", metadata])
            .env_remove("NASD_CONFIG")
            .env("NASD_NEW_PASSWORD", "a new admin password")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    // `nasd up` logs in at its authentication server: the reset changes the password there too.
    assert!(ok(reset(&url)).contains("at the manager and at the authentication server"), "both reset");
    let none = reset(&other);
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("no metadata at"), "{none:?}");
    std::fs::write(manager_dir.join("admin.password"), "a new admin password\n").unwrap();
    let mut d = up(&data, &log, &[]);
    assert!(ok(nasd(&data, &["ls", "/"])).contains("docs"), "the reset password logs in");
    d.terminate();
}

/// The process ids of `pid` and every process below it.
fn process_tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let parent = all[i];
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            if ppid == Some(parent) && !all.contains(&p) {
                all.push(p);
            }
        }
        i += 1;
    }
    all
}

/// Every process's argument list on this machine (`/proc/PID/cmdline`), joined by spaces.
fn every_command_line() -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&raw).replace('\0', " ")))
        })
        .collect()
}

/// Asserts that no process's argument list holds any of `secrets` (named).
#[track_caller]
fn no_secret_in_any_command_line(secrets: &[(&str, String)]) {
    for (pid, line) in every_command_line() {
        for (what, secret) in secrets {
            assert!(!line.contains(secret.as_str()), "the {what} is in the argument list of process {pid}: {line}");
        }
    }
}

/// A key file's hex (what would show on a command line).
fn key_hex(path: &Path) -> String {
    nasd_crypto::read_key_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).to_hex()
}

/// PostgreSQL as libpq users reach it, through the binary: a server that
/// takes the role `nasd` only with its password and only over TLS;
/// `--metadata` with the password in it is refused (a command line is
/// public), `$PGPASSWORD` with `sslmode=verify-full` works, and a restart
/// finds the password in `[manager] metadata_password_file`. Then no
/// process on the machine — `nasd up`, the database server, anything —
/// has the database password, the administrator's password, the service
/// token, `manager.key` or a drive's master key in its argument list
/// (`/proc/PID/cmdline`).
#[test]
fn postgres_credentials_and_tls_as_libpq_and_no_secret_on_a_command_line() {
    const DB_PASSWORD: &str = "db-secret-Ahm3";
    let server =
        PgServer::start_with(&PgServerOptions { tls: true, password: Some(DB_PASSWORD.into()), ..Default::default() })
            .unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let ca = server.ca_cert().unwrap().to_str().unwrap().to_string();
    let url =
        format!("postgres://{PASSWORD_ROLE}@{}/nasd_libpq?sslmode=verify-full&sslrootcert={ca}", server.host_port());
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("cluster");
    std::fs::create_dir_all(&data).unwrap();
    let log = tmp.path().join("up.log");

    // The README's URL with the password in it is refused, before anything is made.
    let with_password = url.replace(&format!("{PASSWORD_ROLE}@"), &format!("{PASSWORD_ROLE}:{DB_PASSWORD}@"));
    let out = Command::new(env!("CARGO_BIN_EXE_nasd"))
        .args(["up", "--data", data.to_str().unwrap(), "--drives", "1", "--metadata", &with_password])
        .env_remove("NASD_CONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("PGPASSWORD"), "{err}");
    assert!(!err.contains(DB_PASSWORD), "{err}");
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0, "nothing made");
    // A database that cannot be reached stops `nasd up` before it makes anything.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let unmade = tmp.path().join("unmade");
    let out = Command::new(env!("CARGO_BIN_EXE_nasd"))
        .args(["up", "--data", unmade.to_str().unwrap(), "--drives", "1", "--manager-port"])
        .arg(free_addr().port().to_string())
        .args(["--metadata", &format!("postgres://nasd@{closed}/nasd?sslmode=disable")])
        .env_remove("NASD_CONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("cannot reach the metadata"), "{err}");
    assert!(!unmade.exists(), "a database that cannot be reached leaves no data directory: {err}");

    // $PGPASSWORD, over verify-full TLS.
    let mut d = up_with_env(&data, &log, &["--metadata", &url], &[("PGPASSWORD", DB_PASSWORD)]);
    let out = d.output_once("metadata  postgres://nasd@");
    assert!(out.contains("metadata  postgres://nasd@"), "{out}");
    ok(nasd(&data, &["mkdir", "/docs"]));
    d.terminate();

    // A restart with the password in the file the config names (0600).
    let password_file = tmp.path().join("db.password");
    std::fs::write(&password_file, format!("{DB_PASSWORD}\n")).unwrap();
    std::fs::set_permissions(&password_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let config = data.join("nasd.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(!text.contains(DB_PASSWORD), "nasd up wrote no password: {text}");
    let text = text.replacen(
        "[manager]\n",
        &format!("[manager]\nmetadata_password_file = \"{}\"\n", password_file.display()),
        1,
    );
    std::fs::write(&config, text).unwrap();
    let d = up_with_env(&data, &log, &[], &[]);
    assert!(ok(nasd(&data, &["ls", "/"])).contains("docs"), "the same metadata after the restart");

    let manager = data.join("manager");
    let mut secrets = vec![
        ("database password", DB_PASSWORD.to_string()),
        (
            "administrator's password",
            std::fs::read_to_string(manager.join("admin.password")).unwrap().trim().to_string(),
        ),
        ("service token", key_hex(&data.join("auth").join("service.token"))),
        ("manager key", key_hex(&manager.join(nasd_manager::KEK_FILE))),
        ("drive master key", key_hex(&data.join("drive-0").join("master.key"))),
    ];
    // Upper-case hex too, and the processes that hold them are there to be read.
    secrets.extend(
        secrets
            .clone()
            .into_iter()
            .filter(|(w, _)| w.ends_with("key") || w.ends_with("token"))
            .map(|(w, s)| (w, s.to_uppercase())),
    );
    let ours = process_tree(d.pid());
    assert!(!ours.is_empty());
    let pg = server.server_pid().expect("the database server's pid");
    assert!(every_command_line().iter().any(|(p, _)| *p == pg), "the database server is among the processes read");
    no_secret_in_any_command_line(&secrets);
    drop(d);
}

/// The address `nasd up` recorded for `key` in `[client]` of its config file.
fn client_setting(data: &Path, key: &str) -> String {
    let text = std::fs::read_to_string(data.join("nasd.toml")).unwrap();
    let client = &text[text.find("[client]").expect("a [client] section")..];
    client
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key} = ")))
        .map(|v| v.trim().trim_matches('"').to_string())
        .unwrap_or_else(|| panic!("no {key} in [client]: {text}"))
}

/// A second manager started on the database of a `nasd up` cluster without
/// `[manager] auth` refuses password logins (the cluster's manager is
/// linked to its authentication server, and the database says so), naming
/// the authentication server; logged in there, the same client is served.
#[test]
fn every_manager_of_a_linked_database_refuses_password_logins() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let url = server.fresh_url();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("cluster");
    std::fs::create_dir_all(&data).unwrap();
    let mut d = up(&data, &tmp.path().join("up.log"), &["--metadata", &url]);
    ok(nasd(&data, &["mkdir", "/docs"]));

    // The second manager: manager.key and the TLS files copied, the same database, nothing else.
    let first = data.join("manager");
    let second = tmp.path().join("manager-2");
    std::fs::create_dir_all(second.join("tls")).unwrap();
    std::fs::copy(first.join(nasd_manager::KEK_FILE), second.join(nasd_manager::KEK_FILE)).unwrap();
    for f in std::fs::read_dir(first.join("tls")).unwrap().flatten() {
        std::fs::copy(f.path(), second.join("tls").join(f.file_name())).unwrap();
    }
    let dir2 = second.clone();
    let url2 = url.clone();
    let mut m2 = Daemon::start("manager-2", tmp.path(), &tmp.path().join("manager-2.log"), None, move |addr| {
        vec![
            "manager".into(),
            "--data".into(),
            dir2.clone().into(),
            "--metadata".into(),
            url2.clone().into(),
            "--listen".into(),
            addr.to_string().into(),
        ]
    });
    let auth = client_setting(&data, "auth");
    let client = |with_auth: bool| {
        let file = tmp.path().join(if with_auth { "identity.toml" } else { "password.toml" });
        let mut text = format!(
            "[client]\nmanager = \"{}\"\nserver_name = \"localhost\"\nca_cert = \"{}\"\nuser = \"admin\"\n\
             password_file = \"{}\"\n",
            m2.addr,
            first.join("tls").join("ca.pem").display(),
            first.join("admin.password").display()
        );
        if with_auth {
            text += &format!("auth = \"{auth}\"\n");
        }
        std::fs::write(&file, text).unwrap();
        file
    };
    let run = |config: &Path| {
        Command::new(env!("CARGO_BIN_EXE_nasd"))
            .arg("--config")
            .arg(config)
            .args(["ls", "/"])
            .env("NO_COLOR", "1")
            .env_remove("NASD_CONFIG")
            .env_remove("NASD_PASSWORD")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let refused = run(&client(false));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "the admin's password logged in at the second manager: {err}");
    assert!(err.contains("takes no passwords") && err.contains(&auth), "says why, naming the server: {err}");
    assert!(m2.output().contains("linked to the authentication server the metadata database names"), "{}", m2.output());
    // With the identity from the authentication server the database names, it serves.
    assert!(ok(run(&client(true))).contains("docs"), "identity login at the second manager");
    m2.terminate();
    d.terminate();
}
