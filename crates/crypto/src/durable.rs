//! Durable small files: key files, and the file manager's TLS files and
//! password files. One implementation for all of them: the bytes go to a
//! staging file that is written whole and synced, which is then moved into
//! place by a rename (or, for a file that must never be replaced, a hard
//! link) whose directory is synced too. A crash, or a write that fails part
//! way (a full disk), leaves the old file or the new one whole — never part
//! of one, and never a new file that a power loss can take back after the
//! caller went on to depend on it.
//!
//! This lives here, in the lowest layer that writes such a file (key files),
//! so that every layer above uses the same code. Errors name the file, never
//! its contents.

use std::io::{Error, ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

fn context(e: Error, what: &str, path: &Path) -> Error {
    Error::new(e.kind(), format!("cannot {what} {}: {e}", path.display()))
}

/// Creates `path`, which must not exist, holding `bytes` with permissions
/// `mode`, and syncs it. A write or sync that fails removes the partial file.
///
/// # Errors
/// `path` exists, or cannot be written or synced.
pub fn write_new(path: &Path, bytes: impl AsRef<[u8]>, mode: u32) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| context(e, "create", path))?;
    let written = f.write_all(bytes.as_ref()).map_err(|e| context(e, "write", path));
    let synced = written.and_then(|()| f.sync_all().map_err(|e| context(e, "sync", path)));
    if synced.is_err() {
        drop(f);
        let _ = std::fs::remove_file(path);
    }
    synced
}

/// [`write_new`] of a staging file: one an interrupted earlier run left at
/// `path` is removed first.
///
/// # Errors
/// As [`write_new`], or the old file cannot be removed.
pub fn write_staged(path: &Path, bytes: impl AsRef<[u8]>, mode: u32) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(context(e, "remove", path)),
        _ => write_new(path, bytes, mode),
    }
}

/// Renames `staged` over `path` and syncs their directory, which makes the
/// rename durable.
///
/// # Errors
/// The rename or the sync fails.
pub fn install(staged: &Path, path: &Path) -> std::io::Result<()> {
    std::fs::rename(staged, path)
        .map_err(|e| Error::new(e.kind(), format!("cannot rename {} to {}: {e}", staged.display(), path.display())))?;
    sync_dir(&parent_dir(path))
}

/// Moves `staged` to `path` only if `path` does not exist (a hard link, which
/// never replaces a file, then the staging name removed), and syncs their
/// directory.
///
/// # Errors
/// `AlreadyExists` if `path` exists (`staged` is removed then too); the link,
/// the removal or the sync fails.
pub fn install_new(staged: &Path, path: &Path) -> std::io::Result<()> {
    let linked = std::fs::hard_link(staged, path);
    let _ = std::fs::remove_file(staged);
    linked.map_err(|e| context(e, "create", path))?;
    sync_dir(&parent_dir(path))
}

/// Creates `path`, which must not exist, holding `bytes` with permissions
/// `mode`, durably: staged at `path.tmp` ([`write_staged`]), then
/// [`install_new`].
///
/// # Errors
/// As [`write_staged`] and [`install_new`].
pub fn create_new(path: &Path, bytes: impl AsRef<[u8]>, mode: u32) -> std::io::Result<()> {
    if path.exists() {
        return Err(Error::new(ErrorKind::AlreadyExists, format!("cannot create {}: it exists", path.display())));
    }
    let staged = with_suffix(path, "tmp")?;
    write_staged(&staged, bytes, mode)?;
    install_new(&staged, path)
}

/// Makes a directory's entries (new, removed and renamed files) durable.
///
/// # Errors
/// The directory cannot be opened or synced.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| context(e, "sync directory", dir))
}

/// The directory holding `path` (`.` for a bare name).
pub fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `path` with `.suffix` appended to its last component.
///
/// # Errors
/// `InvalidInput` if `path` names no file (it ends in `..` or is a root).
pub fn with_suffix(path: &Path, suffix: &str) -> std::io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, format!("{} names no file", path.display())))?;
    Ok(path.with_file_name(format!("{}.{suffix}", name.to_string_lossy())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn staged_files_replace_whole_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        write_new(&file, "old\n", 0o600).unwrap();
        assert!(write_new(&file, "again\n", 0o600).is_err(), "write_new never replaces a file");
        let staged = with_suffix(&file, "new").unwrap();
        assert_eq!(staged, dir.path().join("secret.new"));
        std::fs::write(&staged, "left by a crash").unwrap();
        write_staged(&staged, "new\n", 0o600).unwrap();
        assert_eq!(std::fs::metadata(&staged).unwrap().permissions().mode() & 0o777, 0o600);
        install(&staged, &file).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "new\n");
        assert!(!staged.exists());
        assert_eq!(parent_dir(Path::new("bare")), PathBuf::from("."));
        assert!(with_suffix(Path::new("/"), "tmp").is_err());
    }

    #[test]
    fn create_new_never_replaces_and_ignores_a_staging_file_left_by_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k");
        std::fs::write(dir.path().join("k.tmp"), "partial").unwrap();
        create_new(&file, "whole\n", 0o600).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "whole\n");
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(!dir.path().join("k.tmp").exists(), "the staging name is gone");
        let e = create_new(&file, "other\n", 0o600).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists);
        // A file that appears between the check and the link is not replaced either.
        std::fs::write(dir.path().join("s"), "staged").unwrap();
        let e = install_new(&dir.path().join("s"), &file).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "whole\n");
        assert!(!dir.path().join("s").exists());
    }
}
