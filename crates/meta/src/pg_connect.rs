//! Reaching a PostgreSQL server the way libpq users expect: the password
//! from where libpq looks for it, and TLS by `sslmode` and a root
//! certificate.
//!
//! A [`PgTarget`] is a connection string (`postgres://…` or `key=value …`)
//! resolved once: `sslmode`, `sslrootcert` and `passfile` are taken out of
//! it (`tokio_postgres::Config` knows only `disable`, `prefer` and
//! `require`), the password and user are found, and the TLS setting is
//! built. Nothing here logs or returns a password: [`PgTarget::describe`]
//! is what names the database.
//!
//! Where the password comes from, first found wins: the connection string;
//! the password file the configuration names ([`PgOptions::password_file`],
//! one line, refused if others may read it); `$PGPASSWORD`; the first
//! matching line of the password file libpq would read — the string's
//! `passfile`, else `$PGPASSFILE`, else `~/.pgpass` — ignored with a warning
//! if others may read it, as libpq does. The user is the string's, else
//! `$PGUSER`, else the login name.
//!
//! TLS: `sslmode` from the string, else `$PGSSLMODE`, else `prefer`.
//! `disable` is clear text; `prefer` and `require` encrypt without checking
//! the server unless a root certificate is named or found (`sslrootcert`,
//! `$PGSSLROOTCERT`, `~/.postgresql/root.crt`: then as `verify-ca`);
//! `verify-ca` checks the chain, `verify-full` the chain and the host name
//! (rustls, TLS 1.2 and 1.3); `allow` is refused. A connection that is not
//! `verify-full` to a host other than loopback or a Unix socket is logged
//! once as a warning.

use crate::error::MetaError;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use tokio_postgres::config::{Host, SslMode as PgSslMode};
use tokio_postgres::{Client, Config};

/// Longest password file or `~/.pgpass` read, in bytes: a larger one is refused.
pub const PASSWORD_FILE_MAX: u64 = 64 * 1024;
/// The port libpq assumes when none is given.
const DEFAULT_PORT: u16 = 5432;

/// What the configuration adds to a connection string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PgOptions {
    /// A file holding the password (its first line), e.g. `[manager]
    /// metadata_password_file`; used when the connection string has none.
    pub password_file: Option<PathBuf>,
    /// Most read-write transactions the backend runs at once
    /// [default: [`crate::WRITERS_MAX`]; at most [`crate::CONNECTIONS_MAX`] − 1].
    pub writers_max: Option<usize>,
}

/// libpq's `sslmode`, all of it but `allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Clear text.
    Disable,
    /// TLS if the server offers it; the server checked only against a root certificate if one is
    /// named or found.
    Prefer,
    /// TLS always; the server checked as `Prefer`.
    Require,
    /// TLS; the server's chain checked against the root certificate.
    VerifyCa,
    /// TLS; the chain checked and the host name matched against the server's certificate.
    VerifyFull,
}

impl FromStr for SslMode {
    type Err = MetaError;

    fn from_str(s: &str) -> Result<SslMode, MetaError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => {
                return Err(MetaError::BadUrl(
                    "sslmode=allow is not supported: use prefer, require, verify-ca or verify-full".into(),
                ))
            }
            other => return Err(MetaError::BadUrl(format!("sslmode={other} is not a mode libpq knows"))),
        })
    }
}

impl SslMode {
    fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// How a connection is protected, resolved.
#[derive(Clone)]
enum Tls {
    None,
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

/// A PostgreSQL server and database, resolved once (see the module documentation).
#[derive(Clone)]
pub struct PgTarget {
    config: Config,
    mode: SslMode,
    /// The root certificate file in force, if any.
    root_cert: Option<PathBuf>,
    tls: Tls,
    describe: String,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTarget").field("target", &self.describe).field("sslmode", &self.mode).finish_non_exhaustive()
    }
}

/// The parameters this module takes out of a connection string before
/// `tokio_postgres::Config` reads the rest.
#[derive(Default)]
struct Extracted {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    passfile: Option<String>,
}

impl Extracted {
    fn take(&mut self, key: &str, value: String) -> bool {
        match key {
            "sslmode" => self.sslmode = Some(value),
            "sslrootcert" => self.sslrootcert = Some(value),
            "passfile" => self.passfile = Some(value),
            _ => return false,
        }
        true
    }
}

/// Percent-decodes a URL query value (`%2F` → `/`, `+` kept).
fn percent_decode(s: &str) -> Result<String, MetaError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or_else(|| MetaError::BadUrl("a '%' escape is cut short".into()))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| MetaError::BadUrl("a bad '%' escape".into()))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| MetaError::BadUrl("a parameter is not UTF-8".into()))
}

/// Splits `sslmode`, `sslrootcert` and `passfile` out of a URL's query.
fn split_url(url: &str, out: &mut Extracted) -> Result<String, MetaError> {
    let Some((base, query)) = url.split_once('?') else { return Ok(url.to_string()) };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if !out.take(k, percent_decode(v)?) {
            kept.push(pair);
        }
    }
    Ok(if kept.is_empty() { base.to_string() } else { format!("{base}?{}", kept.join("&")) })
}

/// Splits them out of a `key=value …` string (values quoted with `'`, `\` escaping, as libpq).
fn split_key_values(s: &str, out: &mut Extracted) -> Result<String, MetaError> {
    let mut kept = String::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        if key.is_empty() {
            break;
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(MetaError::BadUrl(format!("'{key}' has no value")));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let (mut value, mut raw) = (String::new(), String::new());
        if chars.peek() == Some(&'\'') {
            raw.push(chars.next().expect("peeked"));
            loop {
                match chars.next() {
                    Some('\\') => {
                        let c = chars.next().ok_or_else(|| MetaError::BadUrl("a '\\' ends the string".into()))?;
                        raw.push('\\');
                        raw.push(c);
                        value.push(c);
                    }
                    Some('\'') => {
                        raw.push('\'');
                        break;
                    }
                    Some(c) => {
                        raw.push(c);
                        value.push(c);
                    }
                    None => return Err(MetaError::BadUrl("a quoted value is not closed".into())),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    let e = chars.next().ok_or_else(|| MetaError::BadUrl("a '\\' ends the string".into()))?;
                    raw.push('\\');
                    raw.push(e);
                    value.push(e);
                } else {
                    raw.push(c);
                    value.push(c);
                }
            }
        }
        if !out.take(&key, value) {
            kept.push_str(&format!("{key}={raw} "));
        }
    }
    Ok(kept.trim_end().to_string())
}

/// Whether a connection string looks like a URL (as libpq decides).
fn is_url(s: &str) -> bool {
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

/// The home directory, for `~/.pgpass` and `~/.postgresql/root.crt`.
fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from)
}

/// Whether `path` may be read by others than its owner (group or world bits).
fn readable_by_others(path: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    Ok(std::fs::metadata(path)?.permissions().mode() & 0o077 != 0)
}

/// Reads a small secret file whole, refusing one over [`PASSWORD_FILE_MAX`].
fn read_small(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?.take(PASSWORD_FILE_MAX + 1).read_to_string(&mut text)?;
    if text.len() as u64 > PASSWORD_FILE_MAX {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "larger than PASSWORD_FILE_MAX"));
    }
    Ok(text)
}

/// The password in the file the configuration names: its first line.
fn configured_password(path: &Path) -> Result<String, MetaError> {
    let shown = path.display();
    if readable_by_others(path).map_err(|e| MetaError::Io(format!("cannot read the password file {shown}: {e}")))? {
        return Err(MetaError::Io(format!(
            "the password file {shown} may be read by others: `chmod 600 {shown}` (it holds the database password)"
        )));
    }
    let text = read_small(path).map_err(|e| MetaError::Io(format!("cannot read the password file {shown}: {e}")))?;
    let line = text.lines().next().unwrap_or("");
    if line.is_empty() {
        return Err(MetaError::Io(format!("the password file {shown} holds no password on its first line")));
    }
    Ok(line.to_string())
}

/// One field of a `.pgpass` line, with `\:` and `\\` unescaped.
fn pgpass_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(e) = chars.next() {
                    fields.last_mut().expect("one field").push(e);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().expect("one field").push(c),
        }
    }
    fields
}

/// The password of the first line of a `.pgpass` text that matches.
fn pgpass_lookup(text: &str, host: &str, port: u16, db: &str, user: &str) -> Option<String> {
    let port = port.to_string();
    let matches = |pattern: &str, value: &str| pattern == "*" || pattern == value;
    text.lines().filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty()).find_map(|line| {
        let f = pgpass_fields(line);
        (f.len() == 5 && matches(&f[0], host) && matches(&f[1], &port) && matches(&f[2], db) && matches(&f[3], user))
            .then(|| f[4].clone())
    })
}

/// The host name a `.pgpass` line matches for `config`'s first host: a Unix
/// socket's directory matches `localhost`, as in libpq.
fn pgpass_host(config: &Config) -> String {
    match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(_)) | None => "localhost".into(),
    }
}

impl PgTarget {
    /// Resolves `conninfo` with `options` (see the module documentation).
    ///
    /// # Errors
    /// [`MetaError::BadUrl`] for a string that does not parse (never
    /// quoting it: it may hold a password) or has no host; [`MetaError::Io`]
    /// for a password file that cannot be used, or a root certificate that
    /// cannot be read.
    pub fn parse(conninfo: &str, options: &PgOptions) -> Result<PgTarget, MetaError> {
        let (mut config, extracted) = parse_rest(conninfo)?;
        if config.get_hosts().is_empty() {
            return Err(MetaError::BadUrl("no host".into()));
        }
        if config.get_user().is_none() {
            let user = std::env::var("PGUSER")
                .or_else(|_| std::env::var("USER"))
                .or_else(|_| std::env::var("LOGNAME"))
                .map_err(|_| MetaError::BadUrl("no user: name one (postgres://USER@HOST/DB) or set $PGUSER".into()))?;
            config.user(&user);
        }
        if config.get_password().is_none() {
            if let Some(password) = find_password(&config, options, extracted.passfile.as_deref())? {
                config.password(password);
            }
        }
        let mode = match extracted.sslmode.or_else(|| std::env::var("PGSSLMODE").ok().filter(|m| !m.is_empty())) {
            Some(m) => m.parse()?,
            None => SslMode::Prefer,
        };
        let root_cert = match extracted.sslrootcert.or_else(|| std::env::var("PGSSLROOTCERT").ok()) {
            Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
            _ => home().map(|h| h.join(".postgresql").join("root.crt")).filter(|p| p.is_file()),
        };
        if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && root_cert.is_none() {
            return Err(MetaError::Io(format!(
                "sslmode={} needs the CA certificate that signed the server's: name it (sslrootcert=FILE in the \
                 URL, or $PGSSLROOTCERT), or put it in ~/.postgresql/root.crt",
                mode.name()
            )));
        }
        config.ssl_mode(match mode {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            _ => PgSslMode::Require,
        });
        let tls = match mode {
            SslMode::Disable => Tls::None,
            _ => Tls::Rustls(tokio_postgres_rustls::MakeRustlsConnect::new(client_config(mode, root_cert.as_deref())?)),
        };
        let describe = crate::postgres::describe(&config);
        Ok(PgTarget { config, mode, root_cert, tls, describe })
    }

    /// `postgres://USER@HOST:PORT/DB`: what names the database in logs and
    /// errors, never with a password.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// The `sslmode` in force.
    pub fn ssl_mode(&self) -> SslMode {
        self.mode
    }

    /// Whether the server is checked as `verify-full` does, or the connection
    /// does not leave the machine (loopback, a Unix socket).
    pub fn verified_or_local(&self) -> bool {
        self.mode == SslMode::VerifyFull
            || self.config.get_hosts().iter().all(|h| match h {
                Host::Unix(_) => true,
                Host::Tcp(name) => {
                    name == "localhost" || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
                }
            })
    }

    /// A warning to log once if the connection can be read or redirected on
    /// the way: not `verify-full`, to another machine.
    pub fn exposure_warning(&self) -> Option<String> {
        (!self.verified_or_local()).then(|| {
            format!(
                "the connection to {} is sslmode={}{}: anyone on the path can {}; use sslmode=verify-full with \
                 sslrootcert=CA.pem",
                self.describe,
                self.mode.name(),
                if self.root_cert.is_some() { "" } else { " without a root certificate" },
                match self.mode {
                    SslMode::Disable => "read and change the metadata",
                    SslMode::VerifyCa => "impersonate the server with any certificate the CA signed",
                    _ => "impersonate the server",
                }
            )
        })
    }

    /// With `connect_timeout` and `application_name` set where the string
    /// did not set them.
    pub fn with_defaults(mut self, connect_timeout: std::time::Duration, application: &str) -> PgTarget {
        if self.config.get_connect_timeout().is_none() {
            self.config.connect_timeout(connect_timeout);
        }
        if self.config.get_application_name().is_none() {
            self.config.application_name(application);
        }
        self
    }

    /// The same target for another database of the server (as the creation
    /// of a missing database connects to `postgres`).
    pub fn with_dbname(&self, db: &str) -> PgTarget {
        let mut t = self.clone();
        t.config.dbname(db);
        t
    }

    /// The resolved `tokio_postgres` configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Connects (on the calling runtime); the connection's I/O is spawned on
    /// it, and `on_close` runs with the error that ended it, if any.
    ///
    /// # Errors
    /// As `tokio_postgres::Config::connect`.
    pub async fn connect(
        &self,
        on_close: impl FnOnce(tokio_postgres::Error) + Send + 'static,
    ) -> Result<Client, tokio_postgres::Error> {
        match &self.tls {
            Tls::None => {
                let (client, connection) = self.config.connect(tokio_postgres::NoTls).await?;
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        on_close(e);
                    }
                });
                Ok(client)
            }
            Tls::Rustls(tls) => {
                let (client, connection) = self.config.connect(tls.clone()).await?;
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        on_close(e);
                    }
                });
                Ok(client)
            }
        }
    }
}

/// The password for `config` from the configured file, the environment or
/// a `.pgpass` file; `None` if none has one (the server may not ask).
fn find_password(config: &Config, options: &PgOptions, passfile: Option<&str>) -> Result<Option<Vec<u8>>, MetaError> {
    if let Some(path) = &options.password_file {
        return Ok(Some(configured_password(path)?.into_bytes()));
    }
    if let Ok(p) = std::env::var("PGPASSWORD") {
        if !p.is_empty() {
            return Ok(Some(p.into_bytes()));
        }
    }
    let file = passfile
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("PGPASSFILE").filter(|p| !p.is_empty()).map(PathBuf::from))
        .or_else(|| home().map(|h| h.join(".pgpass")));
    let Some(file) = file.filter(|f| f.is_file()) else { return Ok(None) };
    match readable_by_others(&file) {
        Ok(false) => {}
        Ok(true) => {
            tracing::warn!(file = %file.display(), "password file has group or world access; permissions should be u=rw (0600) or less: ignored");
            return Ok(None);
        }
        Err(e) => {
            tracing::warn!(file = %file.display(), error = %e, "cannot read the password file: ignored");
            return Ok(None);
        }
    }
    let text = match read_small(&file) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(file = %file.display(), error = %e, "cannot read the password file: ignored");
            return Ok(None);
        }
    };
    let user = config.get_user().unwrap_or("");
    let db = config.get_dbname().unwrap_or(user);
    let port = config.get_ports().first().copied().unwrap_or(DEFAULT_PORT);
    Ok(pgpass_lookup(&text, &pgpass_host(config), port, db, user).map(String::into_bytes))
}

/// The rustls client configuration of `mode` with the root certificates in `root_cert`.
fn client_config(mode: SslMode, root_cert: Option<&Path>) -> Result<rustls::ClientConfig, MetaError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .map_err(|e| MetaError::Io(format!("TLS setup: {e}")))?;
    let Some(path) = root_cert else {
        // prefer/require without a root certificate: encrypted, the server unchecked (as libpq).
        let verifier = Arc::new(Unverified(provider));
        return Ok(builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth());
    };
    let pem = std::fs::read(path)
        .map_err(|e| MetaError::Io(format!("cannot read the database's root certificate {}: {e}", path.display())))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &pem[..]) {
        let cert = cert.map_err(|e| MetaError::Io(format!("{} is not a PEM certificate file: {e}", path.display())))?;
        roots.add(cert).map_err(|e| MetaError::Io(format!("{}: {e}", path.display())))?;
    }
    if roots.is_empty() {
        return Err(MetaError::Io(format!("{} holds no certificate", path.display())));
    }
    let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| MetaError::Io(format!("TLS setup: {e}")))?;
    Ok(if mode == SslMode::VerifyFull {
        builder.with_webpki_verifier(webpki).with_no_client_auth()
    } else {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(ChainOnly(webpki))).with_no_client_auth()
    })
}

/// `verify-ca`: the chain to a trusted root is checked, the host name is not.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext { .. })) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer`/`require` without a root certificate: any certificate (its
/// handshake signature still checked, so the session key is the holder's).
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The connection string `conninfo` without the libpq parameters this
/// module reads itself, parsed; the error never quotes the string.
fn parse_rest(conninfo: &str) -> Result<(Config, Extracted), MetaError> {
    let mut extracted = Extracted::default();
    let rest = if is_url(conninfo) {
        split_url(conninfo, &mut extracted)?
    } else {
        split_key_values(conninfo, &mut extracted)?
    };
    Ok((Config::from_str(&rest).map_err(|e| MetaError::BadUrl(e.to_string()))?, extracted))
}

/// Checks that a connection string parses, names a host and a known
/// `sslmode`, without reading any file or the environment.
///
/// # Errors
/// [`MetaError::BadUrl`] saying what is wrong (not quoting the string).
pub fn check_syntax(conninfo: &str) -> Result<(), MetaError> {
    let (config, extracted) = parse_rest(conninfo)?;
    if config.get_hosts().is_empty() {
        return Err(MetaError::BadUrl("a PostgreSQL URL needs a host".into()));
    }
    if let Some(m) = extracted.sslmode {
        m.parse::<SslMode>()?;
    }
    Ok(())
}

/// `postgres://USER@HOST:PORT/DB` of a connection string, without its
/// password or options (the user as written: the environment's is not
/// looked up).
pub fn describe_conninfo(conninfo: &str) -> String {
    match parse_rest(conninfo) {
        Ok((config, _)) => crate::postgres::describe(&config),
        Err(_) => "postgres://(unparsable)".into(),
    }
}

/// Whether a connection string carries a password (`postgres://U:PW@…` or
/// `password=…`): one given on a command line would be in every local
/// user's `ps`.
pub fn has_password(conninfo: &str) -> bool {
    parse_rest(conninfo).is_ok_and(|(c, _)| c.get_password().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_parameters_are_taken_out_of_urls_and_key_values() {
        let mut e = Extracted::default();
        let rest = split_url("postgres://u@h:5/d?sslmode=verify-full&application_name=x&sslrootcert=%2Fca.pem", &mut e)
            .unwrap();
        assert_eq!(rest, "postgres://u@h:5/d?application_name=x");
        assert_eq!((e.sslmode.as_deref(), e.sslrootcert.as_deref()), (Some("verify-full"), Some("/ca.pem")));
        let mut e = Extracted::default();
        let rest = split_key_values("host=h user=u sslmode=require sslrootcert='/a b.pem' dbname=d", &mut e).unwrap();
        assert_eq!(rest, "host=h user=u dbname=d");
        assert_eq!((e.sslmode.as_deref(), e.sslrootcert.as_deref()), (Some("require"), Some("/a b.pem")));
        assert!(has_password("postgres://u:pw@h/d") && has_password("host=h user=u password=pw"));
        assert!(!has_password("postgres://u@h/d?sslmode=require") && !has_password("host=h user=u"));
        assert!("allow".parse::<SslMode>().is_err() && "nope".parse::<SslMode>().is_err());
    }

    #[test]
    fn pgpass_lines_match_as_libpq_reads_them() {
        let text = "# comment\nother:5432:*:u:no\nh:5433:d:u:wrong-port\nh:*:d:u:p\\:w\\\\d\n*:*:*:*:fallback\n";
        assert_eq!(pgpass_lookup(text, "h", 5432, "d", "u").as_deref(), Some("p:w\\d"));
        assert_eq!(pgpass_lookup(text, "h", 5433, "d", "u").as_deref(), Some("wrong-port"));
        assert_eq!(pgpass_lookup(text, "x", 1, "y", "z").as_deref(), Some("fallback"));
        assert_eq!(pgpass_lookup("h:5432:d:u", "h", 5432, "d", "u"), None, "four fields: no password");
    }
}
