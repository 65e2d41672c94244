//! S3 access keys: a gateway-local store of sealed secrets.
//!
//! Each key belongs to one nasd user (name, uid, gid, groups, as the
//! manager told the issuer). SigV4 needs the secret itself, so it cannot be
//! stored hashed: it is sealed (`nasd_crypto::seal`, XChaCha20-Poly1305)
//! under the store's own key (`store.key`, 0600), the context binding the
//! access key and the user, so a record moved to another access key or
//! user does not open. Records live in `keys.json` (0600, in a 0700
//! directory), replaced durably on every change; the gateway reads the file
//! at every request, so a revocation refuses the key's next request.
//! Bytes: `docs/PROTOCOL.md`, "S3 access-key store".

use nasd_crypto::Key;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// Longest `keys.json` the gateway reads (about 2 500 keys).
pub const KEY_FILE_BYTES_MAX: u64 = 1 << 20;
/// Prefix of every access key the store issues.
pub const ACCESS_KEY_PREFIX: &str = "NASD";
/// Random bytes in an access key (after the prefix, as upper-case hex).
const ACCESS_KEY_RANDOM: usize = 8;
/// Random bytes in a secret (as 40 hex digits).
const SECRET_RANDOM: usize = 20;
/// Context label of a sealed secret (version 1).
const SEAL_LABEL: &[u8] = b"nasd-s3-secret-v1";

/// Why the key store failed.
#[derive(Debug, thiserror::Error)]
pub enum KeyStoreError {
    /// Reading or writing the store's files.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// A file that is not what the store writes (or a wrong store key).
    #[error("{0}")]
    Corrupt(String),
    /// No such access key.
    #[error("no such access key")]
    NoSuchKey,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> KeyStoreError + '_ {
    move |source| KeyStoreError::Io { path: path.to_path_buf(), source }
}

/// Whom a key acts for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyOwner {
    /// nasd user name.
    pub user: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
}

/// One record of `keys.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyRecord {
    /// The access key id clients send.
    pub access_key: String,
    /// Whom it acts for.
    pub owner: KeyOwner,
    /// Seconds since the epoch it was issued.
    pub created: u64,
    /// Hex of the sealed secret (nonce, ciphertext, tag).
    sealed: String,
}

/// A store directory: `store.key` and `keys.json`.
#[derive(Debug, Clone)]
pub struct KeyStore {
    dir: PathBuf,
}

impl KeyStore {
    /// The store in `dir` (created 0700; its key made on first issue).
    pub fn open(dir: &Path) -> Result<KeyStore, KeyStoreError> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io_err(dir))?;
        Ok(KeyStore { dir: dir.to_path_buf() })
    }

    fn key_path(&self) -> PathBuf {
        self.dir.join("store.key")
    }

    fn records_path(&self) -> PathBuf {
        self.dir.join("keys.json")
    }

    /// Every record (secrets sealed).
    pub fn list(&self) -> Result<Vec<KeyRecord>, KeyStoreError> {
        let path = self.records_path();
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(&path)(e)),
        };
        let len = file.metadata().map_err(io_err(&path))?.len();
        if len > KEY_FILE_BYTES_MAX {
            return Err(KeyStoreError::Corrupt(format!("{} is over {KEY_FILE_BYTES_MAX} bytes", path.display())));
        }
        serde_json::from_reader(std::io::BufReader::new(file))
            .map_err(|e| KeyStoreError::Corrupt(format!("{}: {e}", path.display())))
    }

    fn save(&self, records: &[KeyRecord]) -> Result<(), KeyStoreError> {
        let path = self.records_path();
        let staged = self.dir.join("keys.json.staged");
        let text = serde_json::to_vec_pretty(records).map_err(|e| KeyStoreError::Corrupt(e.to_string()))?;
        nasd_crypto::durable::write_staged(&staged, text, 0o600).map_err(io_err(&staged))?;
        nasd_crypto::durable::install(&staged, &path).map_err(io_err(&path))
    }

    /// Issues a key for `owner`: its access key and secret (shown once).
    pub fn create(&self, owner: KeyOwner) -> Result<(String, Zeroizing<String>), KeyStoreError> {
        let path = self.key_path();
        let (key, _) = nasd_crypto::load_or_create_key_file(&path).map_err(io_err(&path))?;
        let access_key =
            format!("{ACCESS_KEY_PREFIX}{}", hex::encode_upper(nasd_crypto::random_bytes::<ACCESS_KEY_RANDOM>()));
        let secret = Zeroizing::new(hex::encode(nasd_crypto::random_bytes::<SECRET_RANDOM>()));
        let sealed = nasd_crypto::seal(&key, &seal_context(&access_key, &owner.user), secret.as_bytes());
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut records = self.list()?;
        records.push(KeyRecord { access_key: access_key.clone(), owner, created, sealed: hex::encode(sealed) });
        self.save(&records)?;
        Ok((access_key, secret))
    }

    /// Removes `access_key`; its next request is refused.
    pub fn revoke(&self, access_key: &str) -> Result<KeyRecord, KeyStoreError> {
        let mut records = self.list()?;
        let at = records.iter().position(|r| r.access_key == access_key).ok_or(KeyStoreError::NoSuchKey)?;
        let gone = records.remove(at);
        self.save(&records)?;
        Ok(gone)
    }

    /// The owner and secret of `access_key`, read from the files now.
    pub fn lookup(&self, access_key: &str) -> Result<(KeyOwner, Zeroizing<String>), KeyStoreError> {
        let record = self.list()?.into_iter().find(|r| r.access_key == access_key).ok_or(KeyStoreError::NoSuchKey)?;
        let path = self.key_path();
        let key = nasd_crypto::read_key_file(&path).map_err(io_err(&path))?;
        let secret = open_secret(&key, &record)?;
        Ok((record.owner, secret))
    }
}

fn open_secret(key: &Key, record: &KeyRecord) -> Result<Zeroizing<String>, KeyStoreError> {
    let sealed =
        hex::decode(&record.sealed).map_err(|_| KeyStoreError::Corrupt("a sealed secret is not hex".into()))?;
    let context = seal_context(&record.access_key, &record.owner.user);
    let secret = nasd_crypto::open(key, &context, &sealed)
        .map_err(|_| KeyStoreError::Corrupt("a sealed secret does not open under the store key".into()))?;
    let secret = Zeroizing::new(secret);
    let text = std::str::from_utf8(&secret).map_err(|_| KeyStoreError::Corrupt("a secret is not UTF-8".into()))?;
    Ok(Zeroizing::new(text.to_string()))
}

/// `SEAL_LABEL || 0 || access key || 0 || user`.
fn seal_context(access_key: &str, user: &str) -> Vec<u8> {
    let mut context = SEAL_LABEL.to_vec();
    for part in [access_key, user] {
        context.push(0);
        context.extend_from_slice(part.as_bytes());
    }
    context
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> KeyOwner {
        KeyOwner { user: "alice".into(), uid: 1000, gid: 1000, groups: vec![5] }
    }

    #[test]
    fn a_key_opens_to_its_secret_and_owner_until_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let store = KeyStore::open(dir.path()).unwrap();
        let (ak, secret) = store.create(alice()).unwrap();
        assert!(ak.starts_with(ACCESS_KEY_PREFIX));
        let (owner, got) = store.lookup(&ak).unwrap();
        assert_eq!(owner, alice());
        assert_eq!(*got, *secret);
        let text = std::fs::read_to_string(dir.path().join("keys.json")).unwrap();
        assert!(!text.contains(secret.as_str()), "the secret is stored sealed");
        store.revoke(&ak).unwrap();
        assert!(matches!(store.lookup(&ak), Err(KeyStoreError::NoSuchKey)));
    }

    /// The known-answer vector of docs/PROTOCOL.md ("S3 access-key store").
    #[test]
    fn sealed_secret_known_answer() {
        let key = Key::from_bytes([7; 32]);
        let context = seal_context("NASD0011223344556677", "alice");
        assert_eq!(hex::encode(&context), KAT_CONTEXT);
        let sealed =
            nasd_crypto::seal_with_nonce(&key, &[9; 24], &context, b"0123456789abcdef0123456789abcdef01234567");
        assert_eq!(hex::encode(&sealed), KAT_SEALED);
        let record = KeyRecord {
            access_key: "NASD0011223344556677".into(),
            owner: KeyOwner { user: "alice".into(), uid: 2000, gid: 2000, groups: vec![] },
            created: 0,
            sealed: KAT_SEALED.into(),
        };
        assert_eq!(open_secret(&key, &record).unwrap().as_str(), "0123456789abcdef0123456789abcdef01234567");
    }

    const KAT_CONTEXT: &str =
        "6e6173642d73332d7365637265742d7631004e4153443030313132323333343435353636373700616c696365";
    const KAT_SEALED: &str = "0909090909090909090909090909090909090909090909098e43d0b9489f4f55cc2b695e0b17628d1ac285a97454abd69eb4793eb042363db21b72e8e6be836305c41b10ad0116b0e55becee6e0d0e65";

    #[test]
    fn a_record_moved_to_another_user_does_not_open() {
        let dir = tempfile::tempdir().unwrap();
        let store = KeyStore::open(dir.path()).unwrap();
        let (ak, _) = store.create(alice()).unwrap();
        let path = dir.path().join("keys.json");
        let text = std::fs::read_to_string(&path).unwrap().replace("\"alice\"", "\"mallory\"");
        std::fs::write(&path, text).unwrap();
        assert!(matches!(store.lookup(&ak), Err(KeyStoreError::Corrupt(_))));
    }
}
