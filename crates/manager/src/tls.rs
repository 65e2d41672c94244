//! TLS for the manager channel: a private certificate authority made by
//! `nasd up` (or `nasd manager --init-tls`), the manager's certificate signed
//! by it, and the acceptor that serves with them. Clients trust the CA file.

use anyhow::Context;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

/// File names inside the TLS directory.
pub const CA_CERT: &str = "ca.pem";
/// The CA's private key (0600; only needed to issue more certificates).
pub const CA_KEY: &str = "ca.key";
/// The manager's certificate chain.
pub const MANAGER_CERT: &str = "manager.pem";
/// The manager's private key (0600).
pub const MANAGER_KEY: &str = "manager.key";

/// Paths of the files a manager serves with.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Certificate chain (PEM).
    pub cert: PathBuf,
    /// Private key (PEM).
    pub key: PathBuf,
    /// The CA clients trust (PEM).
    pub ca: PathBuf,
}

impl TlsFiles {
    /// The standard names inside `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        TlsFiles { cert: dir.join(MANAGER_CERT), key: dir.join(MANAGER_KEY), ca: dir.join(CA_CERT) }
    }
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    Ok(())
}

/// Creates a CA and a manager certificate valid for `names` (DNS names or
/// IP addresses) in `dir`, unless the manager certificate already exists.
/// Returns the files either way.
pub fn ensure_certificates(dir: &Path, names: &[String]) -> anyhow::Result<TlsFiles> {
    let files = TlsFiles::in_dir(dir);
    if files.cert.exists() && files.key.exists() && files.ca.exists() {
        return Ok(files);
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "nasd cluster CA");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    let ca = ca_params.self_signed(&ca_key)?;

    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(names.to_vec()).context("invalid manager host name")?;
    params.distinguished_name.push(rcgen::DnType::CommonName, "nasd manager");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &ca, &ca_key)?;

    write_private(&dir.join(CA_KEY), &ca_key.serialize_pem())?;
    write_private(&files.key, &key.serialize_pem())?;
    std::fs::write(&files.ca, ca.pem()).with_context(|| format!("cannot write {}", files.ca.display()))?;
    std::fs::write(&files.cert, cert.pem() + &ca.pem())
        .with_context(|| format!("cannot write {}", files.cert.display()))?;
    Ok(files)
}

/// A TLS acceptor serving the certificate chain and key in `files`.
pub fn acceptor(files: &TlsFiles) -> anyhow::Result<TlsAcceptor> {
    let certs = rustls_pemfile::certs(
        &mut &std::fs::read(&files.cert)
            .with_context(|| format!("cannot read the manager certificate {}", files.cert.display()))?[..],
    )
    .collect::<Result<Vec<_>, _>>()
    .with_context(|| format!("{} is not a PEM certificate chain", files.cert.display()))?;
    let key = rustls_pemfile::private_key(
        &mut &std::fs::read(&files.key)
            .with_context(|| format!("cannot read the manager key {}", files.key.display()))?[..],
    )
    .with_context(|| format!("{} is not a PEM private key", files.key.display()))?
    .with_context(|| format!("{} holds no private key", files.key.display()))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the manager certificate and key do not match")?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
