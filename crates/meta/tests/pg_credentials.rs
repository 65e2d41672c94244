//! Credentials and TLS to PostgreSQL as libpq users expect them
//! (`nasd_meta::pg_connect`), on a real server that takes the role `nasd`
//! only with its password and only over TLS: a URL without the password
//! finds it in the configured password file or a `.pgpass` file (never in
//! an error), `sslmode=verify-full` with the server's CA connects and with
//! another CA, or to a name the certificate does not hold, fails TLS;
//! `verify-ca` does not check the name; `sslmode=disable` is refused by the
//! server; a password file others may read is refused.

use nasd_meta::pg_connect::PgOptions;
use nasd_meta::testing::{PgServer, PgServerOptions, PASSWORD_ROLE};
use nasd_meta::{MetaError, Postgres};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const PASSWORD: &str = "a database password";

fn write_private(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn open(url: &str, password_file: Option<PathBuf>) -> Result<Postgres, MetaError> {
    Postgres::open_with_options(url, &PgOptions { password_file, ..PgOptions::default() })
}

#[track_caller]
fn refused(r: Result<Postgres, MetaError>, says: &str) -> String {
    let text = match r {
        Ok(_) => panic!("opened; expected a refusal saying {says:?}"),
        Err(e) => e.to_string(),
    };
    assert!(text.contains(says), "{text}");
    assert!(!text.contains(PASSWORD), "the password is in an error: {text}");
    text
}

#[test]
fn passwords_come_from_files_and_tls_is_verified() {
    let server =
        PgServer::start_with(&PgServerOptions { tls: true, password: Some(PASSWORD.into()), ..Default::default() })
            .unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let ca = server.ca_cert().expect("TLS").to_path_buf();
    let tmp = tempfile::tempdir().unwrap();
    let at = |host: &str, db: &str, params: &str| {
        let port = server.host_port().rsplit_once(':').unwrap().1.to_string();
        format!("postgres://{PASSWORD_ROLE}@{host}:{port}/{db}?{params}")
    };
    let verify_full = format!("sslmode=verify-full&sslrootcert={}", ca.display());

    // No password anywhere: the server refuses, and nothing names one.
    let none = at("127.0.0.1", "nasd_a", &format!("{verify_full}&passfile=/nonexistent"));
    refused(open(&none, None), &format!("postgres://{PASSWORD_ROLE}@127.0.0.1:"));

    // The configured password file (first line): verify-full connects, and makes the database.
    let file = tmp.path().join("db.password");
    write_private(&file, &format!("{PASSWORD}\n"), 0o600);
    let pg = open(&none, Some(file.clone())).expect("verify-full with the password file");
    assert_eq!(pg.target(), format!("postgres://{PASSWORD_ROLE}@{}/nasd_a", server.host_port()));
    drop(pg);
    // A password file others may read is refused, saying so.
    write_private(&file, &format!("{PASSWORD}\n"), 0o644);
    refused(open(&none, Some(file.clone())), "chmod 600");
    write_private(&file, &format!("{PASSWORD}\n"), 0o600);

    // A .pgpass file (named by the URL's passfile, as $PGPASSFILE would): the matching line.
    let pgpass = tmp.path().join("pgpass");
    let port = server.host_port().rsplit_once(':').unwrap().1.to_string();
    write_private(
        &pgpass,
        &format!("# nasd\n127.0.0.1:{port}:other:{PASSWORD_ROLE}:wrong\n*:{port}:*:{PASSWORD_ROLE}:{PASSWORD}\n"),
        0o600,
    );
    let with_pgpass = at("127.0.0.1", "nasd_a", &format!("{verify_full}&passfile={}", pgpass.display()));
    drop(open(&with_pgpass, None).expect("the .pgpass line"));
    // Readable by others, libpq ignores it: no password, refused by the server.
    std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o644)).unwrap();
    refused(open(&with_pgpass, None), "postgres://");

    // verify-full checks the name: `localhost` is on the certificate, `db.invalid` (the same
    // server, by hostaddr) is not; verify-ca checks only the chain.
    drop(open(&at("localhost", "nasd_a", &verify_full), Some(file.clone())).expect("localhost is named"));
    let elsewhere = at("db.invalid", "nasd_a", &format!("hostaddr=127.0.0.1&{verify_full}"));
    refused(open(&elsewhere, Some(file.clone())), "postgres://");
    let chain_only =
        at("db.invalid", "nasd_a", &format!("hostaddr=127.0.0.1&sslmode=verify-ca&sslrootcert={}", ca.display()));
    drop(open(&chain_only, Some(file.clone())).expect("verify-ca does not check the name"));

    // Another CA: TLS fails. A server certificate is no CA of its own either.
    let other = PgServer::start_with(&PgServerOptions { tls: true, ..Default::default() }).unwrap();
    let wrong_ca =
        at("127.0.0.1", "nasd_a", &format!("sslmode=verify-full&sslrootcert={}", other.ca_cert().unwrap().display()));
    refused(open(&wrong_ca, Some(file.clone())), "postgres://");

    // verify-full without a root certificate is refused before connecting, saying what it needs.
    refused(open(&at("127.0.0.1", "nasd_a", "sslmode=verify-full&sslrootcert="), Some(file.clone())), "sslrootcert");
    // Clear text: the server takes the role over TLS only.
    refused(open(&at("127.0.0.1", "nasd_a", "sslmode=disable"), Some(file.clone())), "postgres://");
    // allow is not offered.
    refused(open(&at("127.0.0.1", "nasd_a", "sslmode=allow"), Some(file)), "sslmode=allow");
}
