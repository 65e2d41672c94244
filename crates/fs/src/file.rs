//! An open regular file: data moves between the client and the file's
//! drive directly, under a capability the manager minted.

use crate::{Access, FsClient, FsError};
use nasd_client::{Auth, ClientError, Credential, DriveClient, MacAlgorithm};
use nasd_crypto::Key;
use nasd_proto::fs::{FileAttr, Ino};
use nasd_proto::manager::{Handle, ManagerReply, ManagerRequest};
use nasd_proto::{rights, Attributes, Region, Status};
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Tries of one drive request: a refusal that a fresh capability may cure
/// (expired, revoked, retired key) or a broken connection gets one more.
const DRIVE_ATTEMPTS_MAX: usize = 2;

/// A refusal (made before any data moved) that trying again may cure: a
/// fresh capability from the manager for an expired, revoked or retired
/// one; a fresh nonce once the authenticated refusal taught the client the
/// drive's clock.
fn stale_capability(e: &ClientError) -> bool {
    matches!(
        e.status(),
        Some(
            Status::CapabilityExpired | Status::AccessRevoked | Status::KeyVersionRetired | Status::NonceOutsideWindow
        )
    )
}

/// A failure of the connection itself, which a repeatable request may be
/// tried again for on a new one.
fn broken_connection(e: &ClientError) -> bool {
    matches!(e, ClientError::Io(_) | ClientError::Broken | ClientError::Protocol(_))
}

/// A failure after which the connection is dropped and made anew on next
/// use: every one but a drive's refusal and a request refused before it was
/// sent. The client marks the connection broken after any other (a reply
/// that failed verification, a Hash-and-MAC tag that did not check, a
/// broken stream), and keeping it would fail the next call with `Broken`.
fn unusable_connection(e: &ClientError) -> bool {
    !matches!(e, ClientError::Status { .. } | ClientError::InvalidRequest(_))
}

/// Runs one request on the file's drive under a capability with `$rights`,
/// refreshing the capability once if the drive refused it as stale, and —
/// for requests safe to repeat (`$repeatable`: nothing was handed to the
/// caller yet) — the connection once if it broke.
macro_rules! on_drive {
    ($file:expr, $rights:expr, $repeatable:expr, |$c:ident, $a:ident| $call:expr) => {{
        let mut attempt = 0;
        loop {
            attempt += 1;
            let $a = $file.fs.access($file.handle, $rights, $file.writable).await?;
            let slot = $file.fs.drive_slot(&$a.components[0].drive_addr);
            let mut guard = slot.lock().await;
            let r = match $file.ready(&mut guard, &$a).await {
                Ok($c) => $call.await,
                Err(e) => Err(e),
            };
            match r {
                Err(e)
                    if attempt < DRIVE_ATTEMPTS_MAX
                        && (stale_capability(&e) || ($repeatable && broken_connection(&e))) =>
                {
                    if unusable_connection(&e) {
                        *guard = None;
                    }
                    $file.fs.forget($file.handle.ino);
                }
                Err(e) => {
                    if unusable_connection(&e) {
                        *guard = None;
                    }
                    break Err(FsError::Drive(e));
                }
                Ok(v) => break Ok(v),
            }
        }
    }};
}

/// An open regular file.
#[derive(Debug)]
pub struct File {
    fs: FsClient,
    handle: Handle,
    writable: bool,
    wrote: AtomicBool,
}

impl File {
    pub(crate) fn new(fs: FsClient, handle: Handle, writable: bool) -> Self {
        File { fs, handle, writable, wrote: AtomicBool::new(false) }
    }

    /// The file's inode number.
    pub fn ino(&self) -> Ino {
        self.handle.ino
    }

    /// The file's handle (opaque; valid for this client's user only).
    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// The drive connection in `slot`, connected and set to use `access`. A
    /// kept connection the drive has closed meanwhile (after its idle
    /// timeout) is replaced first, so no request goes out on it.
    async fn ready<'s>(
        &self,
        slot: &'s mut Option<DriveClient>,
        file_access: &Access,
    ) -> Result<&'s mut DriveClient, ClientError> {
        let access = &file_access.components[0];
        if slot.as_ref().is_some_and(|c| !c.is_reusable()) {
            *slot = None;
        }
        if slot.is_none() {
            let c = DriveClient::connect_with_timeout(access.drive_addr.as_str(), self.fs.reply_timeout()).await?;
            if c.drive_id() != access.drive_id {
                return Err(ClientError::Protocol(format!(
                    "the drive at {} is not the drive the manager named",
                    access.drive_addr
                )));
            }
            *slot = Some(c);
        }
        let c = slot.as_mut().expect("connected above");
        let same = matches!(&c.auth().credential, Credential::Capability { token, .. } if *token == access.token);
        if !same {
            let algorithm = MacAlgorithm::from_id(file_access.algorithm)
                .ok_or_else(|| ClientError::Protocol("unknown capability algorithm".into()))?;
            let credential =
                Credential::Capability { token: access.token.clone(), key: Key::from_bytes(access.key), algorithm };
            c.set_auth(Auth::new(credential, self.fs.protection_for(file_access)));
        }
        Ok(c)
    }

    fn object(a: &Access) -> (u64, u64) {
        (a.components[0].object.partition, a.components[0].object.object)
    }

    /// The object's attributes, straight from the drive (size, times).
    pub async fn drive_attrs(&self) -> Result<Attributes, FsError> {
        on_drive!(self, rights::GETATTR, true, |c, a| {
            let (p, o) = Self::object(&a);
            c.getattr(p, o)
        })
    }

    /// Reads up to `len` bytes at `offset` into `dst`, stopping at the end
    /// of the file; returns the bytes read. Every byte is verified before it
    /// reaches `dst`.
    pub async fn read_to(&self, offset: u64, len: u64, dst: &mut (impl AsyncWrite + Unpin)) -> Result<u64, FsError> {
        let piece = self.fs.transfer_piece() as u64;
        let mut done = 0;
        while done < len {
            let want = piece.min(len - done);
            let region = Region { offset: offset + done, length: want };
            let lengths = on_drive!(self, rights::READ, false, |c, a| {
                let (p, o) = Self::object(&a);
                c.read_to(p, o, std::slice::from_ref(&region), &mut *dst)
            })?;
            let got = lengths.first().copied().unwrap_or(0);
            done += got;
            if got < want {
                break;
            }
        }
        dst.flush().await?;
        Ok(done)
    }

    /// Reads up to `len` bytes at `offset`.
    pub async fn read_at(&self, offset: u64, len: u64) -> Result<Vec<u8>, FsError> {
        let mut out = Vec::new();
        self.read_to(offset, len, &mut out).await?;
        Ok(out)
    }

    /// Writes `data` at `offset`.
    pub async fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), FsError> {
        let piece = self.fs.transfer_piece();
        for (i, chunk) in data.chunks(piece).enumerate() {
            self.write_piece(offset + (i * piece) as u64, chunk).await?;
        }
        Ok(())
    }

    /// Writes `len` bytes read from `src` starting at `offset`, one transfer
    /// piece at a time (memory stays at one piece); returns bytes written.
    pub async fn write_from(&self, offset: u64, len: u64, src: &mut (impl AsyncRead + Unpin)) -> Result<u64, FsError> {
        let piece = self.fs.transfer_piece();
        let mut buf = vec![0u8; piece.min(len as usize)];
        let mut done = 0u64;
        while done < len {
            let n = (piece as u64).min(len - done) as usize;
            src.read_exact(&mut buf[..n]).await?;
            self.write_piece(offset + done, &buf[..n]).await?;
            done += n as u64;
        }
        Ok(done)
    }

    async fn write_piece(&self, offset: u64, data: &[u8]) -> Result<(), FsError> {
        if data.is_empty() {
            return Ok(());
        }
        if !self.writable {
            return Err(FsError::Fs {
                status: nasd_proto::fs::FsStatus::PermissionDenied,
                message: "file not opened for writing".into(),
            });
        }
        self.wrote.store(true, Ordering::Relaxed);
        let region = Region { offset, length: data.len() as u64 };
        on_drive!(self, rights::WRITE, true, |c, a| {
            let (p, o) = Self::object(&a);
            c.write(p, o, std::slice::from_ref(&region), data)
        })?;
        Ok(())
    }

    /// Makes everything written so far durable on the drive (`fsync`).
    pub async fn flush(&self) -> Result<(), FsError> {
        if !self.wrote.load(Ordering::Relaxed) {
            return Ok(());
        }
        let objects = [Self::object(&self.fs.access(self.handle, rights::FLUSH, self.writable).await?).1];
        on_drive!(self, rights::FLUSH, true, |c, a| c.flush(Self::object(&a).0, &objects))
    }

    /// Closes the file; after writes, the manager records the size the
    /// drive reports. Returns the attributes.
    pub async fn close(self) -> Result<FileAttr, FsError> {
        let req = if self.wrote.load(Ordering::Relaxed) {
            ManagerRequest::Commit {
                handle: self.handle,
                txn: 0,
                written_end: 0,
                missed: Vec::new(),
                dirty: Vec::new(),
            }
        } else {
            ManagerRequest::GetAttr { handle: self.handle, open: nasd_proto::manager::OpenMode::None }
        };
        match self.fs.call(&req).await? {
            ManagerReply::Entry(e) => Ok(e.attr),
            other => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }
}
