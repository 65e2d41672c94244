//! Keys as paths: which keys can be nasd paths, and the levels they name.

use s3s::{s3_error, S3Error};

/// Longest key (S3's limit).
pub const KEY_BYTES_MAX: usize = 1024;
/// Longest level of a key (a nasd name).
const NAME_BYTES_MAX: usize = 255;

/// The levels of `key` (split at `/`), or why it cannot be a path.
pub(crate) fn object_path(key: &str) -> Result<Vec<&str>, S3Error> {
    if key.len() > KEY_BYTES_MAX {
        return Err(s3_error!(KeyTooLongError));
    }
    let levels: Vec<&str> = key.split('/').collect();
    for level in &levels {
        if let Some(why) = unusable(level) {
            return Err(S3Error::with_message(
                s3s::S3ErrorCode::InvalidArgument,
                format!("this gateway stores keys as paths, and a key cannot {why}"),
            ));
        }
    }
    Ok(levels)
}

/// A key ending in `/` (a "directory marker", as s3fs-fuse and consoles
/// make): the levels of the directory it names, or why they cannot be a
/// path; `None` for any other key.
pub(crate) fn dir_marker(key: &str) -> Option<Result<Vec<&str>, S3Error>> {
    let dir = key.strip_suffix('/')?;
    Some(object_path(dir))
}

fn unusable(level: &str) -> Option<&'static str> {
    if level.is_empty() {
        Some("have an empty level (a leading, trailing or double '/')")
    } else if level == "." || level == ".." {
        Some("have a level '.' or '..'")
    } else if level.len() > NAME_BYTES_MAX {
        Some("have a level over 255 bytes")
    } else if level.contains('\0') {
        Some("contain NUL")
    } else if is_internal(level) {
        Some("use the file-system layer's temporary or hidden names")
    } else {
        None
    }
}

/// The directory of a bucket that holds its multipart uploads in progress.
pub(crate) const UPLOADS_DIR: &str = ".nasd-s3-uploads";

/// Names the file-system layer and the gateway use for themselves (never
/// shown as keys).
pub(crate) fn is_internal(name: &str) -> bool {
    (name.starts_with('.') && name.ends_with(nasd_vfs::TEMP_SUFFIX))
        || name.starts_with(nasd_vfs::HIDDEN_PREFIX)
        || name == UPLOADS_DIR
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_are_paths_split_into_levels() {
        assert_eq!(object_path("a/b/c.txt").unwrap(), ["a", "b", "c.txt"]);
        assert_eq!(object_path("x").unwrap(), ["x"]);
    }

    #[test]
    fn keys_that_cannot_be_paths_are_refused() {
        for key in [
            "",
            "/a",
            "a/",
            "a//b",
            "a/./b",
            "../x",
            "a/.f.1234abcd.nasd-tmp",
            ".nasd-unlinked-1",
            ".nasd-s3-uploads/x",
        ] {
            let e = object_path(key).unwrap_err();
            assert_eq!(*e.code(), s3s::S3ErrorCode::InvalidArgument, "{key}");
        }
        assert_eq!(dir_marker("a/b/").unwrap().unwrap(), ["a", "b"]);
        assert!(dir_marker("a/b").is_none());
        assert!(dir_marker("/").unwrap().is_err() && dir_marker("a//").unwrap().is_err());
        let long = "a".repeat(KEY_BYTES_MAX + 1);
        assert_eq!(*object_path(&long).unwrap_err().code(), s3s::S3ErrorCode::KeyTooLongError);
    }
}
