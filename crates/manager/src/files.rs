//! Durable small files the manager keeps beside its metadata (TLS keys and
//! certificates, the administrator's password file): created whole and
//! synced, replaced by a rename whose directory entry is synced too, so a
//! crash leaves either the old file or the new one.

use anyhow::Context;
use std::path::{Path, PathBuf};

/// Creates `path`, which must not exist, holding `text` with permissions
/// `mode`, and syncs it.
///
/// # Errors
/// `path` exists, or cannot be written or synced.
pub fn write_new(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
    f.sync_all().with_context(|| format!("cannot sync {}", path.display()))
}

/// [`write_new`] of a staging file: one an interrupted earlier run left at
/// `path` is removed first.
///
/// # Errors
/// As [`write_new`], or the old file cannot be removed.
pub fn write_staged(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot remove {}", path.display()))
        }
        _ => write_new(path, text, mode),
    }
}

/// Renames `staged` over `path` and syncs their directory, which makes the
/// rename durable.
///
/// # Errors
/// The rename or the sync fails.
pub fn install(staged: &Path, path: &Path) -> anyhow::Result<()> {
    std::fs::rename(staged, path)
        .with_context(|| format!("cannot rename {} to {}", staged.display(), path.display()))?;
    sync_dir(&parent_dir(path))
}

/// Makes a directory's entries (new, removed and renamed files) durable.
///
/// # Errors
/// The directory cannot be opened or synced.
pub fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync directory {}", dir.display()))
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
/// `path` names no file (it ends in `..` or is a root).
pub fn with_suffix(path: &Path, suffix: &str) -> anyhow::Result<PathBuf> {
    let name = path.file_name().with_context(|| format!("{} names no file", path.display()))?;
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
}
