//! The README's PostgreSQL and several-managers sections, run as written:
//! its `nasd up --metadata` URL (role `nasd`, `sslmode=verify-full` with
//! `sslrootcert`, the password in `$PGPASSWORD`) against a real PostgreSQL
//! server the test starts with TLS and a password; then its `nasd admin
//! join-bundle`, `nasd manager --join` and `nasd auth --join` lines, each
//! with the test's addresses and directories put in for the example's
//! (`db.example.com:5432`, `/etc/nasd/db-ca.pem`, `/var/lib/nasd/…`,
//! `*.example.com`, ports 7300/7299, which other tests on this machine may
//! hold). Clients listing the new manager and server first, then the first
//! ones (`failover`, `auth_failover`), are served by them, and by the first
//! ones once the new ones are killed.

use nasd_meta::testing::{PgServer, PgServerOptions, PASSWORD_ROLE};
use std::ffi::OsString;
use std::path::Path;
use std::process::Output;

mod common;

use common::{free_addr, nasd_command, ok, Daemon};

const DB_PASSWORD: &str = "db-secret-Oo7e";

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap()
}

/// The lines of the first `sh` block after `marker` that start with `prefix`.
fn block_line(readme: &str, marker: &str, prefix: &str) -> String {
    let from = &readme[readme.find(marker).unwrap_or_else(|| panic!("README has {marker:?}"))..];
    let block = &from[from.find("```sh\n").expect("a sh block") + 6..];
    let block = &block[..block.find("```").unwrap()];
    let line = block.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no `{prefix}` in {block}"));
    // Without its comment.
    line.split("   #").next().unwrap().trim().to_string()
}

/// The words of a README command line, quotes removed (the lines here hold
/// no spaces inside quotes).
fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(|w| w.trim_matches('\'').to_string()).collect()
}

fn nasd(cwd: &Path, config: Option<&Path>, args: &[String]) -> Output {
    let mut c = nasd_command();
    if let Some(config) = config {
        c.arg("--config").arg(config);
    }
    c.args(args).current_dir(cwd).env("PGPASSWORD", DB_PASSWORD).output().expect("run nasd")
}

#[test]
fn the_readme_postgres_and_several_managers_sections_run_as_written() {
    let text = readme();
    let server =
        PgServer::start_with(&PgServerOptions { tls: true, password: Some(DB_PASSWORD.into()), ..Default::default() })
            .unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let ca = server.ca_cert().unwrap().to_str().unwrap().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let ours = |line: &str| {
        line.replace("db.example.com:5432", &server.host_port())
            .replace("/etc/nasd/db-ca.pem", &ca)
            .replace("/var/lib/nasd", cwd.join("var").to_str().unwrap())
    };

    // `nasd up --metadata 'postgres://nasd@…'`, with $PGPASSWORD, in ./nasd-data as the README's tour.
    let up_line = ours(&block_line(&text, "On PostgreSQL", "nasd up --metadata"));
    let up_words = words(&up_line);
    assert!(up_words[3].starts_with(&format!("postgres://{PASSWORD_ROLE}@")), "{up_line}");
    let mut up = Daemon::start_with_env("nasd up", cwd, &cwd.join("up.log"), None, &[("PGPASSWORD", DB_PASSWORD)], {
        let up_words = up_words.clone();
        move |addr| {
            let mut args: Vec<OsString> = up_words[1..].iter().map(OsString::from).collect();
            args.extend(["--drives".into(), "2".into(), "--drive-capacity".into(), "64MiB".into()]);
            args.extend(["--manager-port".into(), addr.port().to_string().into()]);
            args.extend(["--first-drive-port".into(), free_addr().port().to_string().into()]);
            args
        }
    });
    let up_config = cwd.join("nasd-data").join("nasd.toml");
    ok(nasd(cwd, None, &words("nasd mkdir /docs")[1..]));

    // The several-managers lines.
    let bundle_line = block_line(&text, "Several managers may share", "nasd admin join-bundle");
    let made = ok(nasd(cwd, None, &words(&ours(&bundle_line))[1..]));
    assert!(made.contains("nasd auth --join"), "the bundle carries auth.key: {made}");
    // "On the new machine": a directory of its own, with nothing but the bundle.
    let new_machine = cwd.join("new-machine");
    std::fs::create_dir_all(&new_machine).unwrap();
    std::fs::copy(cwd.join("m2.bundle"), new_machine.join("m2.bundle")).unwrap();
    let join_daemon = |name: &'static str, line: String| {
        let w = words(&line);
        let listen = w.iter().position(|x| x == "--listen").expect("--listen") + 1;
        let log = cwd.join(format!("{name}.log"));
        Daemon::start_with_env(name, &new_machine, &log, None, &[("PGPASSWORD", DB_PASSWORD)], {
            move |addr| {
                let mut w = w.clone();
                w[listen] = addr.to_string();
                w.iter()
                    .skip(1)
                    .map(|x| {
                        OsString::from(x.replace("m2.example.com", "localhost").replace("a2.example.com", "localhost"))
                    })
                    .collect()
            }
        })
    };
    let manager_line = ours(&block_line(&text, "Several managers may share", "nasd manager --join"));
    let mut m2 = join_daemon("manager-2", manager_line);
    let auth_line = ours(&block_line(&text, "The authentication server `nasd up` runs keeps", "nasd auth --join"));
    let mut a2 = join_daemon("auth-2", auth_line);

    // Clients: the new ones first, then the first ones.
    let config_text = std::fs::read_to_string(&up_config).unwrap();
    let mut config: toml::Table = toml::from_str(&config_text).unwrap();
    let client = config.get_mut("client").and_then(|c| c.as_table_mut()).unwrap();
    let (m1, a1) = (client["manager"].as_str().unwrap().to_string(), client["auth"].as_str().unwrap().to_string());
    client.insert("manager".into(), m2.addr.to_string().into());
    client.insert("failover".into(), toml::Value::Array(vec![m1.into()]));
    client.insert("auth".into(), a2.addr.to_string().into());
    client.insert("auth_failover".into(), toml::Value::Array(vec![a1.into()]));
    let both = cwd.join("both.toml");
    std::fs::write(&both, toml::to_string(&config).unwrap()).unwrap();
    std::fs::write(cwd.join("a.txt"), b"served by the second manager").unwrap();
    ok(nasd(cwd, Some(&both), &words("nasd put a.txt /docs/a.txt")[1..]));
    assert!(m2.output().contains("linked to the authentication server the metadata database names"), "{}", m2.output());

    // The new ones die: the first ones serve the same clients.
    m2.kill();
    a2.kill();
    ok(nasd(cwd, Some(&both), &words("nasd get /docs/a.txt back.txt")[1..]));
    assert_eq!(std::fs::read(cwd.join("back.txt")).unwrap(), b"served by the second manager");
    assert!(ok(nasd(cwd, Some(&both), &words("nasd ls /docs")[1..])).contains("a.txt"));
    up.terminate();
}
