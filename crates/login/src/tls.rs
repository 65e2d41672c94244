//! TLS for the manager channel: a private certificate authority made when
//! a manager first starts (`nasd up` or `nasd manager`), the manager's
//! certificate signed by it, and the acceptor that serves with them. Clients
//! trust the CA file.
//!
//! Crash safety: a new set of files is written into a temporary directory,
//! each file and the directory synced, and then renamed into place in one
//! step, so the TLS directory holds either nothing or a whole set. A new
//! manager certificate for an existing CA (after the old one was removed) is
//! written to temporary files; an old certificate still there is removed
//! first, then the key and last the certificate are renamed in, so a crash
//! in between leaves no certificate and the next start issues again. A
//! certificate whose key does not match (what a crash between the renames
//! of an older version left) is found at start and issued again too.

use anyhow::Context;
use nasd_crypto::durable::{install, parent_dir, sync_dir, with_suffix, write_new, write_staged};
use rustls::client::danger::ServerCertVerifier;
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
/// Distinguished name (common name) of the cluster CA.
const CA_NAME: &str = "nasd cluster CA";

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

fn ca_params() -> anyhow::Result<rcgen::CertificateParams> {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, CA_NAME);
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    Ok(ca_params)
}

/// A manager certificate for `names` signed by the CA; its key.
fn manager_cert(
    names: &[String],
    ca: &rcgen::Certificate,
    ca_key: &rcgen::KeyPair,
) -> anyhow::Result<(rcgen::Certificate, rcgen::KeyPair)> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(names.to_vec()).context("invalid manager host name")?;
    params.distinguished_name.push(rcgen::DnType::CommonName, "nasd manager");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, ca, ca_key)?;
    Ok((cert, key))
}

/// Creates a CA and a manager certificate valid for `names` (DNS names or
/// IP addresses) in `dir`, unless the manager certificate already exists.
/// Returns the files either way.
///
/// Repairs what an interrupted start left: with the CA certificate present
/// (clients may trust it) but no manager certificate or key, or a manager
/// certificate that does not match its key, a new one is issued by the same
/// CA; without a CA certificate, nothing was ever served from
/// `dir`, so whatever is there is moved aside (`DIR.partial-SECONDS`, with a
/// warning) and a whole new set is made.
///
/// # Errors
/// The CA certificate is there but its key is not (a new manager
/// certificate cannot be issued: the message says what to do); files cannot
/// be written.
pub fn ensure_certificates(dir: &Path, names: &[String]) -> anyhow::Result<TlsFiles> {
    let files = TlsFiles::in_dir(dir);
    if files.cert.exists() && files.key.exists() && files.ca.exists() {
        if !key_mismatch(&files)? {
            return Ok(files);
        }
        reissue(dir, &files, names)?;
        tracing::warn!(
            cert = %files.cert.display(),
            "the manager certificate did not match its key (an interrupted reissue); issued a new one from the CA"
        );
        return Ok(files);
    }
    if files.ca.exists() {
        reissue(dir, &files, names)?;
        tracing::warn!(cert = %files.cert.display(), "issued a new manager certificate from the existing CA");
        return Ok(files);
    }
    if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
        let secs = nasd_env::clock::system_ns() / 1_000_000_000;
        let aside = with_suffix(dir, &format!("partial-{secs}"))?;
        std::fs::rename(dir, &aside)
            .with_context(|| format!("cannot move the incomplete TLS files in {} aside", dir.display()))?;
        tracing::warn!(
            dir = %dir.display(),
            moved_to = %aside.display(),
            "the TLS directory held an incomplete set of files (no {CA_CERT}: an interrupted first start); \
             moved it aside and making a new CA"
        );
    }
    generate(dir, names)?;
    Ok(files)
}

/// Writes a new CA and manager certificate into a temporary directory,
/// syncs it, and renames it to `dir` (which must be absent or empty).
fn generate(dir: &Path, names: &[String]) -> anyhow::Result<()> {
    let parent = parent_dir(dir);
    std::fs::create_dir_all(&parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let tmp = with_suffix(dir, "tmp")?;
    if tmp.exists() {
        // Left by an interrupted generation: never renamed into place, never served.
        std::fs::remove_dir_all(&tmp).with_context(|| format!("cannot remove {}", tmp.display()))?;
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&tmp)
            .with_context(|| format!("cannot create {}", tmp.display()))?;
    }
    let ca_key = rcgen::KeyPair::generate()?;
    let ca = ca_params()?.self_signed(&ca_key)?;
    let (cert, key) = manager_cert(names, &ca, &ca_key)?;
    write_new(&tmp.join(CA_KEY), ca_key.serialize_pem(), 0o600)?;
    write_new(&tmp.join(MANAGER_KEY), key.serialize_pem(), 0o600)?;
    write_new(&tmp.join(CA_CERT), ca.pem(), 0o644)?;
    write_new(&tmp.join(MANAGER_CERT), cert.pem() + &ca.pem(), 0o644)?;
    sync_dir(&tmp)?;
    if dir.exists() {
        std::fs::remove_dir(dir).with_context(|| format!("cannot replace the empty directory {}", dir.display()))?;
    }
    Ok(install(&tmp, dir)?)
}

/// Issues a new manager certificate for `names` from the CA in `dir`.
fn reissue(dir: &Path, files: &TlsFiles, names: &[String]) -> anyhow::Result<()> {
    let ca_key_path = dir.join(CA_KEY);
    let ca_pem = std::fs::read_to_string(&files.ca).with_context(|| format!("cannot read {}", files.ca.display()))?;
    let ca_key = match std::fs::read_to_string(&ca_key_path) {
        Ok(pem) => {
            rcgen::KeyPair::from_pem(&pem).with_context(|| format!("{} is not a PEM key", ca_key_path.display()))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "{} has no manager certificate ({MANAGER_CERT}) and no CA key ({CA_KEY}) to issue one: restore {}, or \
             move {} aside to make a new CA (clients must then trust the new {CA_CERT})",
            dir.display(),
            ca_key_path.display(),
            dir.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", ca_key_path.display())),
    };
    // The same name and key as the CA in ca.pem: what it signs verifies against ca.pem.
    let ca = ca_params()?.self_signed(&ca_key)?;
    let (cert, key) = manager_cert(names, &ca, &ca_key)?;
    let (key_tmp, cert_tmp) = (with_suffix(&files.key, "tmp")?, with_suffix(&files.cert, "tmp")?);
    write_staged(&key_tmp, key.serialize_pem(), 0o600)?;
    write_staged(&cert_tmp, cert.pem() + &ca_pem, 0o644)?;
    // An old certificate goes first (durably), then the key, the certificate
    // last: a crash at any point leaves no certificate beside a key it does
    // not match, and the next start issues again.
    if files.cert.exists() {
        std::fs::remove_file(&files.cert).with_context(|| format!("cannot remove {}", files.cert.display()))?;
        sync_dir(dir)?;
    }
    install(&key_tmp, &files.key)?;
    install(&cert_tmp, &files.cert)?;
    let missing = names_missing(files, names)?;
    anyhow::ensure!(missing.is_empty(), "the new manager certificate does not verify for {missing:?}");
    Ok(())
}

/// The names among `names` that the manager certificate in `files` is not
/// valid for, checked as a client checks it (against the CA in `files.ca`).
/// A manager started with names its certificate lacks serves clients that
/// use them a TLS failure.
///
/// # Errors
/// The files cannot be read, or the certificate does not verify against
/// the CA for another reason (the message says which).
pub fn names_missing(files: &TlsFiles, names: &[String]) -> anyhow::Result<Vec<String>> {
    let read_certs = |path: &Path| -> anyhow::Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
        let pem = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        rustls_pemfile::certs(&mut &pem[..])
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("{} is not a PEM certificate file", path.display()))
    };
    let mut roots = rustls::RootCertStore::empty();
    for ca in read_certs(&files.ca)? {
        roots.add(ca).with_context(|| format!("{} holds an unusable CA certificate", files.ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .with_context(|| format!("cannot check certificates against {}", files.ca.display()))?;
    let chain = read_certs(&files.cert)?;
    let (end_entity, intermediates) =
        chain.split_first().with_context(|| format!("{} holds no certificate", files.cert.display()))?;
    let now = rustls::pki_types::UnixTime::now();
    let mut missing = Vec::new();
    for name in names {
        let Ok(server_name) = rustls::pki_types::ServerName::try_from(name.as_str()) else {
            missing.push(name.clone());
            continue;
        };
        match verifier.verify_server_cert(end_entity, intermediates, &server_name, &[], now) {
            Ok(_) => {}
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName | rustls::CertificateError::NotValidForNameContext { .. },
            )) => missing.push(name.clone()),
            Err(e) => anyhow::bail!(
                "the manager certificate {} does not verify against {}: {e}",
                files.cert.display(),
                files.ca.display()
            ),
        }
    }
    Ok(missing)
}

/// Whether the manager certificate in `files` is for another key than the
/// one in `files.key`. Files that cannot be read or parsed are not judged
/// here ([`acceptor`] reports them).
fn key_mismatch(files: &TlsFiles) -> anyhow::Result<bool> {
    let Ok((certs, key)) = chain_and_key(files) else { return Ok(false) };
    let provider = rustls::crypto::ring::default_provider();
    Ok(matches!(
        rustls::sign::CertifiedKey::from_der(certs, key, &provider),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch))
    ))
}

/// The certificate chain and private key in `files`.
fn chain_and_key(
    files: &TlsFiles,
) -> anyhow::Result<(Vec<rustls::pki_types::CertificateDer<'static>>, rustls::pki_types::PrivateKeyDer<'static>)> {
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
    Ok((certs, key))
}

/// A TLS acceptor serving the certificate chain and key in `files`.
pub fn acceptor(files: &TlsFiles) -> anyhow::Result<TlsAcceptor> {
    let (certs, key) = chain_and_key(files)?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the manager certificate and key do not match")?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn a_new_set_is_complete_valid_and_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tls");
        let files = ensure_certificates(&dir, &names(&["localhost", "127.0.0.1"])).unwrap();
        assert_eq!(entries(&dir), [CA_KEY, CA_CERT, MANAGER_KEY, MANAGER_CERT]);
        assert_eq!(entries(tmp.path()), ["tls"], "no temporary directory left behind");
        assert!(names_missing(&files, &names(&["localhost", "127.0.0.1"])).unwrap().is_empty());
        acceptor(&files).unwrap();
        let ca = std::fs::read(&files.ca).unwrap();
        ensure_certificates(&dir, &names(&["localhost"])).unwrap();
        assert_eq!(std::fs::read(&files.ca).unwrap(), ca, "an existing set is kept");
    }

    /// What the old one-file-at-a-time generation left when it crashed, and
    /// what a crash inside the temporary directory leaves: the next start
    /// makes a whole new set (create_new used to fail on every start).
    #[test]
    fn an_interrupted_first_start_is_repaired() {
        for left in [&[CA_KEY][..], &[CA_KEY, MANAGER_KEY][..]] {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("tls");
            std::fs::create_dir(&dir).unwrap();
            for f in left {
                std::fs::write(dir.join(f), "half").unwrap();
            }
            std::fs::create_dir(tmp.path().join("tls.tmp")).unwrap();
            std::fs::write(tmp.path().join("tls.tmp").join(CA_KEY), "half").unwrap();
            let files = ensure_certificates(&dir, &names(&["localhost"])).expect("repaired");
            assert!(names_missing(&files, &names(&["localhost"])).unwrap().is_empty());
            acceptor(&files).unwrap();
            let all = entries(tmp.path());
            assert_eq!(all.len(), 2, "{all:?}");
            assert!(all[1].starts_with("tls.partial-"), "the remains were moved aside: {all:?}");
            assert_eq!(entries(&tmp.path().join(&all[1])), left);
        }
    }

    /// What a crash inside a reissue used to leave when only the key was
    /// missing: the new key renamed in beside the old certificate. Every
    /// start then failed in `acceptor`; now the next start issues again.
    #[test]
    fn a_certificate_that_does_not_match_its_key_is_issued_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tls");
        let files = ensure_certificates(&dir, &names(&["localhost"])).unwrap();
        let ca = std::fs::read(&files.ca).unwrap();
        let old_cert = std::fs::read(&files.cert).unwrap();
        std::fs::remove_file(&files.key).unwrap();
        std::fs::write(&files.key, rcgen::KeyPair::generate().unwrap().serialize_pem()).unwrap();
        let e = acceptor(&files).err().expect("a mismatched pair cannot serve").to_string();
        assert!(e.contains("do not match"), "{e}");

        ensure_certificates(&dir, &names(&["localhost"])).expect("repaired");
        acceptor(&files).expect("the pair matches again");
        assert_ne!(std::fs::read(&files.cert).unwrap(), old_cert, "a new certificate");
        assert_eq!(std::fs::read(&files.ca).unwrap(), ca, "from the same CA");
        assert!(names_missing(&files, &names(&["localhost"])).unwrap().is_empty());
        assert_eq!(entries(&dir), [CA_KEY, CA_CERT, MANAGER_KEY, MANAGER_CERT], "no temporary files left");
    }

    #[test]
    fn names_the_certificate_lacks_are_found_and_a_reissue_keeps_the_ca() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tls");
        let files = ensure_certificates(&dir, &names(&["localhost"])).unwrap();
        let wanted = names(&["localhost", "nasd.example.com", "10.1.2.3"]);
        assert_eq!(names_missing(&files, &wanted).unwrap(), names(&["nasd.example.com", "10.1.2.3"]));

        // What the warning tells the operator to do: remove the manager's
        // certificate and key, start again.
        let ca = std::fs::read(&files.ca).unwrap();
        std::fs::remove_file(&files.cert).unwrap();
        std::fs::remove_file(&files.key).unwrap();
        ensure_certificates(&dir, &wanted).unwrap();
        assert_eq!(std::fs::read(&files.ca).unwrap(), ca, "clients keep trusting the same CA");
        assert!(names_missing(&files, &wanted).unwrap().is_empty());
        acceptor(&files).unwrap();
        assert_eq!(entries(&dir), [CA_KEY, CA_CERT, MANAGER_KEY, MANAGER_CERT]);

        // Without the CA key a certificate cannot be issued: say what to do.
        std::fs::remove_file(&files.cert).unwrap();
        std::fs::remove_file(dir.join(CA_KEY)).unwrap();
        let e = ensure_certificates(&dir, &wanted).expect_err("no CA key").to_string();
        assert!(e.contains("no CA key") && e.contains("aside"), "{e}");
    }
}
