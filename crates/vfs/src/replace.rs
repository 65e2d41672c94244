//! Atomic create-and-replace: a file is written under a temporary name
//! beside its destination ([`temp_name`]) and put in place only when whole
//! and committed — by a rename (which replaces atomically: readers see the
//! old file or the new one, never a part), or, to never replace, by a hard
//! link that fails if the destination appeared meanwhile. On failure the
//! temporary name is removed ([`Replacement::abandon`]). `nasd put` and
//! `nasd cp` copy this way; a gateway's "upload then rename" (S3 PUT) will.

use crate::ops::{CreateFlags, Opened};
use crate::{Vfs, VfsError};
use nasd_fs::{Entry, FsClient, FsStatus, Ino};

/// Suffix of the temporary names files are written under.
pub const TEMP_SUFFIX: &str = ".nasd-tmp";

/// A fresh temporary name beside `name`: `.NAME.XXXXXXXX.nasd-tmp`, eight
/// random hex digits so concurrent writers of one name never meet.
pub fn temp_name(name: &str) -> String {
    let tag: [u8; 4] = nasd_crypto::random_bytes();
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    format!(".{name}.{tag}{TEMP_SUFFIX}")
}

/// A file being written under a temporary name, to replace (or make) a
/// destination once whole.
#[derive(Debug)]
pub struct Replacement {
    vfs: Vfs,
    cx: FsClient,
    parent: Ino,
    name: String,
    temp: String,
    entry: Entry,
    opened: Opened,
}

impl Vfs {
    /// Creates `temp` (a [`temp_name`] of `name`) in directory `parent`,
    /// exclusively, with `mode`, and opens it for writing: write through
    /// [`Replacement::fh`] with [`Vfs::write`], then
    /// [`publish`](Replacement::publish) it as `name`.
    ///
    /// # Errors
    /// The manager's refusal to create `temp` (nothing was made).
    pub async fn begin_replace(
        &self,
        cx: &FsClient,
        parent: Ino,
        name: &str,
        temp: &str,
        mode: u32,
    ) -> Result<Replacement, VfsError> {
        let (entry, opened) =
            self.create(cx, parent, temp, mode, CreateFlags { exclusive: true, truncate: false, write: true }).await?;
        Ok(Replacement {
            vfs: self.clone(),
            cx: cx.clone(),
            parent,
            name: name.to_string(),
            temp: temp.to_string(),
            entry,
            opened,
        })
    }
}

impl Replacement {
    /// The open file description to write through ([`Vfs::write`]).
    pub fn fh(&self) -> u64 {
        self.opened.fh
    }

    /// The file to write through (its streaming calls, e.g.
    /// [`nasd_fs::File::write_from`]).
    ///
    /// # Errors
    /// [`VfsError::BadDescriptor`] once it was published or abandoned.
    pub fn file(&self) -> Result<std::sync::Arc<nasd_fs::File>, VfsError> {
        self.vfs.file_of(self.opened.fh)
    }

    /// The temporary file's entry (handle, attributes at its creation).
    pub fn entry(&self) -> &Entry {
        &self.entry
    }

    /// The temporary name.
    pub fn temp(&self) -> &str {
        &self.temp
    }

    /// Commits what was written, closes the file and puts it in place:
    /// renamed over the destination, or with `no_clobber` hard-linked to it
    /// (then the temporary name removed). Returns `false`, removing the
    /// temporary file, if `no_clobber` found the destination there.
    ///
    /// # Errors
    /// The commit (the writes are then lost), the rename or link; the
    /// temporary name is left for the caller to [`abandon`](Self::abandon)
    /// or remove — `Replacement` is consumed, so use [`Vfs::unlink`] with
    /// [`temp`](Self::temp).
    pub async fn publish(self, no_clobber: bool) -> Result<bool, VfsError> {
        let committed = self.vfs.commit(self.opened.fh).await;
        let released = self.vfs.release(self.opened.fh).await;
        committed?;
        released?;
        let (vfs, cx, parent) = (&self.vfs, &self.cx, self.parent);
        if !no_clobber {
            vfs.rename(cx, (parent, &self.temp), (parent, &self.name)).await?;
            vfs.forget(self.entry.attr.ino, 1);
            return Ok(true);
        }
        let linked = vfs.link(cx, self.entry.attr.ino, parent, &self.name).await;
        vfs.unlink(cx, parent, &self.temp).await?;
        match linked {
            Ok(_) => {
                vfs.forget(self.entry.attr.ino, 2);
                Ok(true)
            }
            Err(e) if e.status() == Some(FsStatus::Exists) => {
                vfs.forget(self.entry.attr.ino, 1);
                Ok(false)
            }
            Err(e) => {
                vfs.forget(self.entry.attr.ino, 1);
                Err(e)
            }
        }
    }

    /// Gives the replacement up: closes the file (its writes are not
    /// committed if the close's commit fails) and removes the temporary name.
    ///
    /// # Errors
    /// The removal failed (the temporary name is left).
    pub async fn abandon(self) -> Result<(), VfsError> {
        let _ = self.vfs.release(self.opened.fh).await;
        let r = self.vfs.unlink(&self.cx, self.parent, &self.temp).await;
        self.vfs.forget(self.entry.attr.ino, 1);
        r
    }
}
