//! Key files: one key as 64 hex digits and a newline, readable by its owner only.

use crate::Key;
use std::io::{Error, ErrorKind};
use std::path::Path;

/// Reads a key file. The error names the file, never its contents.
pub fn read_key_file(path: &Path) -> std::io::Result<Key> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::new(e.kind(), format!("cannot read key file {}: {e}", path.display())))?;
    Key::from_hex(&text).ok_or_else(|| {
        Error::new(ErrorKind::InvalidData, format!("{} does not hold a key (64 hex digits)", path.display()))
    })
}

/// Writes `key` to a new file created 0600, durably ([`crate::durable::create_new`]:
/// staged, synced, linked into place, directory synced); fails if it exists.
/// A write that fails part way (a full disk) or a crash leaves no file at
/// `path`, never a partial key: `manager.key` seals every drive key, and a
/// master key file controls its drive.
pub fn create_key_file(path: &Path, key: &Key) -> std::io::Result<()> {
    crate::durable::create_new(path, format!("{}\n", key.to_hex()), 0o600).map_err(|e| {
        Error::new(e.kind(), format!("cannot create key file {} (it must not exist yet): {e}", path.display()))
    })
}

/// Reads the key file at `path`, or creates it with a fresh random key.
/// Returns the key and whether it was created.
pub fn load_or_create_key_file(path: &Path) -> std::io::Result<(Key, bool)> {
    if path.exists() {
        return Ok((read_key_file(path)?, false));
    }
    let key = Key::random();
    create_key_file(path, &key)?;
    Ok((key, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn key_files_round_trip_owner_only_and_never_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.key");
        let (key, created) = load_or_create_key_file(&path).unwrap();
        assert!(created);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let (again, created) = load_or_create_key_file(&path).unwrap();
        assert!(!created);
        assert_eq!(again, key);
        assert!(create_key_file(&path, &Key::random()).is_err(), "an existing key file is never replaced");
        std::fs::write(&path, "not hex").unwrap();
        let err = read_key_file(&path).unwrap_err().to_string();
        assert!(err.contains("64 hex digits") && !err.contains("not hex"), "{err}");
    }
}
