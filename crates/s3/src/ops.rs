//! The S3 operations, each translated into file-system layer calls run as
//! the request's key's user.

use crate::checksum::{Expected, StoredChecksum};
use crate::list::{url_encode, Listing, Query};
use crate::paths::{dir_marker, object_path};
use crate::{Gateway, DELETE_OBJECTS_MAX, IO_CHUNK, LIST_KEYS_MAX, METADATA_BYTES_MAX, META_XATTR, OBJECT_BYTES_MAX};
use crate::{KeyStoreError, DRAIN_BYTES_MAX, READ_AHEAD_CHUNKS};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use md5::{Digest, Md5};
use nasd_fs::{Entry, FileAttr, FileKind, FsClient, FsStatus, Ino, XattrMode, ROOT_INO};
use nasd_vfs::{Vfs, VfsError};
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, S3};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Mode of a bucket (private to its owner; ACLs may share it).
const BUCKET_MODE: u32 = 0o700;
/// Mode of the directories keys with `/` make.
const DIR_MODE: u32 = 0o755;
/// Mode of an object.
pub(crate) const OBJECT_MODE: u32 = 0o644;
/// `access` mask: read and search.
const READ_SEARCH: u32 = 0o5;

/// The ETag of an empty body (a directory marker's).
const EMPTY_MD5: &str = "d41d8cd98f00b204e9800998ecf8427e";
/// The Content-Type a directory marker answers with (as s3fs-fuse makes them).
const DIRECTORY_CONTENT_TYPE: &str = "application/x-directory";

/// What [`META_XATTR`] holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ObjectMeta {
    pub etag: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    pub metadata: HashMap<String, String>,
    /// The additional checksum the client sent with the body (`checksum.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<StoredChecksum>,
    /// The multipart upload that made the object, so that a completion
    /// retried finds its work done (`multipart.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<String>,
}

/// Sets an output's `checksum_*` fields to `$checksum`'s (an `Option<&StoredChecksum>`).
macro_rules! with_checksum {
    ($output:expr, $checksum:expr) => {{
        let mut output = $output;
        if let Some(c) = $checksum {
            let c: s3s::dto::Checksum = c.algorithm.into_checksum(c.value.clone());
            output.checksum_crc32 = c.checksum_crc32;
            output.checksum_crc32c = c.checksum_crc32c;
            output.checksum_crc64nvme = c.checksum_crc64nvme;
            output.checksum_sha1 = c.checksum_sha1;
            output.checksum_sha256 = c.checksum_sha256;
        }
        output
    }};
}
pub(crate) use with_checksum;

/// A held inode, forgotten when dropped.
pub(crate) struct Held {
    vfs: Vfs,
    pub entry: Entry,
}

impl Held {
    pub fn ino(&self) -> Ino {
        self.entry.attr.ino
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.vfs.forget(self.entry.attr.ino, 1);
    }
}

/// The S3 error a file-system failure is.
pub(crate) fn s3_err(e: VfsError) -> S3Error {
    let code = match e.status() {
        Some(FsStatus::NotFound) => S3ErrorCode::NoSuchKey,
        Some(FsStatus::PermissionDenied | FsStatus::NotPermitted) => S3ErrorCode::AccessDenied,
        Some(FsStatus::NotEmpty) => S3ErrorCode::BucketNotEmpty,
        Some(FsStatus::NoSpace | FsStatus::QuotaExceeded) => S3ErrorCode::EntityTooLarge,
        Some(FsStatus::NameTooLong) => S3ErrorCode::KeyTooLongError,
        Some(FsStatus::InvalidName | FsStatus::NotDir | FsStatus::IsDir | FsStatus::Exists) => {
            S3ErrorCode::InvalidArgument
        }
        _ if matches!(e, VfsError::Denied) => S3ErrorCode::AccessDenied,
        _ => {
            tracing::warn!(error = %e, "S3 request failed in the file system");
            S3ErrorCode::InternalError
        }
    };
    S3Error::with_message(code, e.to_string())
}

pub(crate) fn is(e: &VfsError, status: FsStatus) -> bool {
    e.status() == Some(status)
}

pub(crate) fn timestamp(ns: i64) -> Timestamp {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ns)).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    Timestamp::from(t)
}

/// An object's length: a file's size; 0 for the directory a marker names.
fn object_size(attr: &FileAttr) -> u64 {
    if attr.kind == FileKind::Dir {
        0
    } else {
        attr.size
    }
}

fn etag(meta: &Option<ObjectMeta>) -> Option<ETag> {
    meta.as_ref().map(|m| ETag::Strong(m.etag.clone()))
}

impl Gateway {
    /// The client acting for the request's key's user: the gateway's own
    /// client for a key of the gateway's user, else `AS_USER` for the key's.
    pub(crate) fn acting<T>(&self, req: &S3Request<T>) -> S3Result<FsClient> {
        let Some(credentials) = req.credentials.as_ref() else {
            return Err(s3_error!(AccessDenied, "anonymous requests are refused: sign with an access key"));
        };
        if !self.rates.admit(&credentials.access_key, std::time::Instant::now()) {
            return Err(s3_error!(SlowDown, "this access key is over its request rate"));
        }
        let owner = match self.keys.lookup(&credentials.access_key) {
            Ok((owner, _)) => owner,
            Err(KeyStoreError::NoSuchKey) => return Err(s3_error!(InvalidAccessKeyId)),
            Err(e) => {
                tracing::error!(error = %e, "the S3 key store cannot be read");
                return Err(s3_error!(InternalError, "the key store cannot be read"));
            }
        };
        let fs = self.vfs.fs();
        if owner.user == fs.user() && owner.uid == fs.identity().uid {
            // The gateway's own user (`nasd up`'s administrator key): itself, no grant needed.
            return Ok(fs.clone());
        }
        fs.as_user(owner.uid, owner.gid, &owner.groups).map_err(|e| s3_err(e.into()))
    }

    pub(crate) fn held(&self, entry: Entry) -> Held {
        Held { vfs: self.vfs.clone(), entry }
    }

    /// Bucket `name`'s directory, held.
    pub(crate) async fn bucket(&self, cx: &FsClient, name: &str) -> S3Result<Held> {
        match self.vfs.lookup(cx, ROOT_INO, name).await {
            Ok(e) => {
                let held = self.held(e);
                if held.entry.attr.kind != FileKind::Dir {
                    return Err(s3_error!(NoSuchBucket));
                }
                Ok(held)
            }
            Err(e) if is(&e, FsStatus::NotFound) => Err(s3_error!(NoSuchBucket)),
            Err(e) => Err(s3_err(e)),
        }
    }

    /// Walks `levels` down from `dir`: the last one reached, held; with
    /// `make`, missing directories are made.
    pub(crate) async fn walk(&self, cx: &FsClient, mut dir: Held, levels: &[&str], make: bool) -> S3Result<Held> {
        for level in levels {
            let next = match self.vfs.lookup(cx, dir.ino(), level).await {
                Ok(e) => e,
                Err(e) if make && is(&e, FsStatus::NotFound) => {
                    match self.vfs.mkdir(cx, dir.ino(), level, DIR_MODE).await {
                        Ok(e) => e,
                        Err(e) if is(&e, FsStatus::Exists) => {
                            self.vfs.lookup(cx, dir.ino(), level).await.map_err(s3_err)?
                        }
                        Err(e) => return Err(s3_err(e)),
                    }
                }
                Err(e) => return Err(s3_err(e)),
            };
            dir = self.held(next);
            if dir.entry.attr.kind != FileKind::Dir {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidArgument,
                    "a prefix of this key names an object, and this gateway stores keys as paths",
                ));
            }
        }
        Ok(dir)
    }

    /// Object `key` of `bucket`, held, with its stored metadata.
    pub(crate) async fn object(&self, cx: &FsClient, bucket: &str, key: &str) -> S3Result<(Held, Option<ObjectMeta>)> {
        if let Some(levels) = dir_marker(key) {
            return self.marker(cx, bucket, &levels?).await;
        }
        let levels = object_path(key)?;
        let (name, dirs) = levels.split_last().ok_or_else(|| s3_error!(InvalidArgument))?;
        let b = self.bucket(cx, bucket).await?;
        let not_found = |e: S3Error| if *e.code() == S3ErrorCode::InvalidArgument { s3_error!(NoSuchKey) } else { e };
        let dir = self.walk(cx, b, dirs, false).await.map_err(not_found)?;
        let file = match self.vfs.lookup(cx, dir.ino(), name).await {
            Ok(e) => self.held(e),
            Err(e) if is(&e, FsStatus::NotFound) => return Err(s3_error!(NoSuchKey)),
            Err(e) => return Err(s3_err(e)),
        };
        if file.entry.attr.kind != FileKind::File {
            return Err(s3_error!(NoSuchKey));
        }
        let meta = self.meta(cx, file.ino()).await?;
        Ok((file, meta))
    }

    /// The directory a directory-marker key (`a/b/`, levels `levels`) of
    /// `bucket` names, held, with the metadata it answers with.
    async fn marker(&self, cx: &FsClient, bucket: &str, levels: &[&str]) -> S3Result<(Held, Option<ObjectMeta>)> {
        let b = self.bucket(cx, bucket).await?;
        let not_found = |e: S3Error| if *e.code() == S3ErrorCode::InvalidArgument { s3_error!(NoSuchKey) } else { e };
        let dir = self.walk(cx, b, levels, false).await.map_err(not_found)?;
        let meta = ObjectMeta {
            etag: EMPTY_MD5.into(),
            content_type: Some(DIRECTORY_CONTENT_TYPE.into()),
            metadata: HashMap::new(),
            checksum: None,
            upload: None,
        };
        Ok((dir, Some(meta)))
    }

    /// A directory-marker `PUT` (`levels`, from a key ending in `/`): its
    /// directories made; its body must be empty.
    async fn put_marker(&self, cx: &FsClient, bucket: &str, levels: &[&str], body: &mut StreamingBlob) -> S3Result<()> {
        while let Some(piece) = body.next().await {
            let piece = piece.map_err(|e| S3Error::with_message(S3ErrorCode::IncompleteBody, e.to_string()))?;
            if !piece.is_empty() {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidArgument,
                    "a key ending in '/' is a directory here: its body must be empty",
                ));
            }
        }
        let b = self.bucket(cx, bucket).await?;
        self.walk(cx, b, levels, true).await.map(drop)
    }

    /// Removes the directory a directory-marker key names if it is empty
    /// (absent or not empty: done, as S3's `DELETE` of a marker leaves the
    /// keys below it).
    async fn delete_marker(&self, cx: &FsClient, bucket: &str, levels: &[&str]) -> S3Result<()> {
        let Some((name, dirs)) = levels.split_last() else { return Err(s3_error!(InvalidArgument)) };
        let b = self.bucket(cx, bucket).await?;
        let parent = match self.walk(cx, b, dirs, false).await {
            Ok(p) => p,
            Err(e) if matches!(*e.code(), S3ErrorCode::NoSuchKey | S3ErrorCode::InvalidArgument) => return Ok(()),
            Err(e) => return Err(e),
        };
        match self.vfs.rmdir(cx, parent.ino(), name).await {
            Ok(()) => Ok(()),
            Err(e) if [FsStatus::NotFound, FsStatus::NotEmpty, FsStatus::NotDir].iter().any(|&s| is(&e, s)) => Ok(()),
            Err(e) => Err(s3_err(e)),
        }
    }

    pub(crate) async fn meta(&self, cx: &FsClient, ino: Ino) -> S3Result<Option<ObjectMeta>> {
        match self.vfs.getxattr(cx, ino, META_XATTR).await {
            Ok(v) => Ok(serde_json::from_slice(&v).ok()),
            Err(e) if is(&e, FsStatus::NoXattr) || e.errno() == 61 => Ok(None),
            Err(e) => Err(s3_err(e)),
        }
    }

    /// Writes `body` as object `key` of `bucket`: whole, or not at all.
    /// `false` if `no_clobber` found it there.
    #[allow(clippy::too_many_arguments)]
    async fn write_object<S, E>(
        &self,
        cx: &FsClient,
        bucket: &str,
        key: &str,
        body: S,
        meta: ObjectMeta,
        expected: Expected,
        no_clobber: bool,
    ) -> S3Result<Option<ObjectMeta>>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let levels = object_path(key)?;
        self.write_levels(cx, bucket, &levels, body, meta, expected, no_clobber).await
    }

    /// [`write_object`](Self::write_object) of a path checked by the caller;
    /// `meta.etag`, if set, is kept (a multipart ETag), else the body's MD5;
    /// the body must hash to what `expected` says (else nothing is stored),
    /// and the checksum it names is kept. The metadata stored; `None` if
    /// `no_clobber` found the object there.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn write_levels<S, E>(
        &self,
        cx: &FsClient,
        bucket: &str,
        levels: &[&str],
        body: S,
        mut meta: ObjectMeta,
        expected: Expected,
        no_clobber: bool,
    ) -> S3Result<Option<ObjectMeta>>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let (name, dirs) = levels.split_last().ok_or_else(|| s3_error!(InvalidArgument))?;
        check_metadata(&meta)?;
        let b = self.bucket(cx, bucket).await?;
        let dir = self.walk(cx, b, dirs, true).await?;
        let temp = nasd_vfs::temp_name(name);
        let replacement = self.vfs.begin_replace(cx, dir.ino(), name, &temp, OBJECT_MODE).await.map_err(s3_err)?;
        let mut hasher = expected.hasher();
        let written =
            self.fill(replacement.fh(), 0..OBJECT_BYTES_MAX, IO_CHUNK, body, hasher.as_mut()).await.map(|(md5, _)| md5);
        let verified = written.and_then(|md5| Ok((md5, expected.verify(&md5, hasher.map(|h| h.finalize()))?)));
        let stored = match verified {
            Ok((md5, checksum)) => {
                if meta.etag.is_empty() {
                    meta.etag = hex::encode(md5);
                }
                if checksum.is_some() {
                    meta.checksum = checksum;
                }
                let value = serde_json::to_vec(&meta).map_err(|_| s3_error!(InternalError))?;
                let ino = replacement.entry().attr.ino;
                self.vfs.setxattr(cx, ino, META_XATTR, &value, XattrMode::Either).await.map_err(s3_err)
            }
            Err(e) => Err(e),
        };
        if let Err(e) = stored {
            if let Err(gone) = replacement.abandon().await {
                tracing::warn!(error = %gone, "removing an abandoned upload's temporary name failed");
            }
            return Err(e);
        }
        match replacement.publish(no_clobber).await {
            Ok(true) => Ok(Some(meta)),
            Ok(false) => Ok(None),
            Err(e) => {
                if let Err(gone) = self.vfs.unlink(cx, dir.ino(), &temp).await {
                    tracing::warn!(error = %gone, "removing an unpublished upload's temporary name failed");
                }
                Err(s3_err(e))
            }
        }
    }

    /// Streams `body` into open file `fh` from `range.start`, never past
    /// `range.end` (`EntityTooLarge`), in pieces that end on multiples of
    /// `piece_bytes` (or at the body's end), hashing it into `checksum` too
    /// if given: its MD5 and length.
    pub(crate) async fn fill<S, E>(
        &self,
        fh: u64,
        range: std::ops::Range<u64>,
        piece_bytes: usize,
        mut body: S,
        mut checksum: Option<&mut s3s::checksum::ChecksumHasher>,
    ) -> S3Result<([u8; 16], u64)>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        assert!(piece_bytes > 0, "pieces hold bytes");
        let mut md5 = Md5::new();
        let mut buf: Vec<u8> = Vec::with_capacity(piece_bytes);
        let mut offset = range.start;
        loop {
            let next = body.next().await;
            let done = next.is_none();
            if let Some(piece) = next {
                let piece = piece.map_err(|e| S3Error::with_message(S3ErrorCode::IncompleteBody, e.to_string()))?;
                if offset + (buf.len() + piece.len()) as u64 > range.end {
                    return Err(s3_error!(EntityTooLarge));
                }
                md5.update(&piece);
                if let Some(h) = checksum.as_mut() {
                    h.update(&piece);
                }
                buf.extend_from_slice(&piece);
            }
            loop {
                let to_boundary = piece_bytes - (offset % piece_bytes as u64) as usize;
                let n = if buf.len() >= to_boundary {
                    to_boundary
                } else if done && !buf.is_empty() {
                    buf.len()
                } else {
                    break;
                };
                self.vfs.write(fh, offset, &buf[..n]).await.map_err(s3_err)?;
                offset += n as u64;
                buf.drain(..n);
            }
            if done {
                return Ok((md5.finalize().into(), offset - range.start));
            }
        }
    }

    /// Bytes `range` of held object `file`, streamed by a task that reads
    /// at most [`READ_AHEAD_CHUNKS`] ahead of the client.
    pub(crate) async fn read_stream(
        &self,
        cx: &FsClient,
        file: Held,
        range: std::ops::Range<u64>,
    ) -> S3Result<StreamingBlob> {
        let opened = self.vfs.open(cx, file.ino(), false).await.map_err(s3_err)?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(READ_AHEAD_CHUNKS);
        let vfs = self.vfs.clone();
        // The reads are the request's: under its trace id, though the response went out first.
        let trace = nasd_client::trace::current();
        tokio::spawn(nasd_client::trace::scope(trace, async move {
            let mut at = range.start;
            while at < range.end {
                let n = (range.end - at).min(IO_CHUNK as u64) as u32;
                let piece = match vfs.read(opened.fh, at, n).await {
                    Ok(p) if p.is_empty() => Err(std::io::Error::other("the object ended early")),
                    Ok(p) => Ok(p),
                    Err(e) => Err(std::io::Error::other(e.to_string())),
                };
                let failed = piece.is_err();
                at += piece.as_ref().map_or(0, |p| p.len() as u64);
                if tx.send(piece.map(Bytes::from)).await.is_err() || failed {
                    break;
                }
            }
            let _ = vfs.release(opened.fh).await;
            drop(file);
        }));
        Ok(StreamingBlob::wrap(ReceiverStream(rx)))
    }

    /// Removes object `key` (absent: done) and the directories it leaves empty.
    async fn delete_key(&self, cx: &FsClient, bucket: &str, key: &str) -> S3Result<()> {
        if let Some(levels) = dir_marker(key) {
            return self.delete_marker(cx, bucket, &levels?).await;
        }
        let levels = object_path(key)?;
        let (name, dirs) = levels.split_last().ok_or_else(|| s3_error!(InvalidArgument))?;
        let b = self.bucket(cx, bucket).await?;
        let mut chain = vec![b];
        for level in dirs {
            let parent = chain.last().map(Held::ino).unwrap_or(ROOT_INO);
            match self.vfs.lookup(cx, parent, level).await {
                Ok(e) if e.attr.kind == FileKind::Dir => chain.push(self.held(e)),
                Ok(e) => {
                    self.vfs.forget(e.attr.ino, 1);
                    return Ok(());
                }
                Err(e) if is(&e, FsStatus::NotFound) => return Ok(()),
                Err(e) => return Err(s3_err(e)),
            }
        }
        let parent = chain.last().map(Held::ino).unwrap_or(ROOT_INO);
        match self.vfs.lookup(cx, parent, name).await {
            Ok(e) => {
                let kind = e.attr.kind;
                self.vfs.forget(e.attr.ino, 1);
                if kind != FileKind::File {
                    return Ok(());
                }
            }
            Err(e) if is(&e, FsStatus::NotFound) => return Ok(()),
            Err(e) => return Err(s3_err(e)),
        }
        match self.vfs.unlink(cx, parent, name).await {
            Ok(()) => {}
            Err(e) if is(&e, FsStatus::NotFound) => return Ok(()),
            Err(e) => return Err(s3_err(e)),
        }
        // The prefix goes with its last key, as in S3.
        for (i, level) in dirs.iter().enumerate().rev() {
            if self.vfs.rmdir(cx, chain[i].ino(), level).await.is_err() {
                break;
            }
        }
        Ok(())
    }

    async fn listing(
        &self,
        cx: &FsClient,
        bucket: &str,
        prefix: &str,
        delimiter: Option<&str>,
        after: &str,
        max_keys: Option<i32>,
    ) -> S3Result<Listing> {
        let b = self.bucket(cx, bucket).await?;
        self.vfs.access(cx, b.ino(), READ_SEARCH).await.map_err(s3_err)?;
        let max = max_keys.map_or(LIST_KEYS_MAX, |m| usize::try_from(m).unwrap_or(0).min(LIST_KEYS_MAX));
        self.list(cx, b.ino(), &Query { prefix, delimiter, after, max }).await
    }
}

pub(crate) fn check_metadata(meta: &ObjectMeta) -> S3Result<()> {
    let bytes: usize = meta.metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > METADATA_BYTES_MAX {
        return Err(s3_error!(MetadataTooLarge));
    }
    Ok(())
}

/// A request without a body.
pub(crate) fn empty_body() -> StreamingBlob {
    StreamingBlob::wrap(futures::stream::empty::<Result<Bytes, std::io::Error>>())
}

/// Reads (and drops) what a failed request left of its body, at most
/// [`DRAIN_BYTES_MAX`]: answered before its body was read, the connection
/// would otherwise not be in step for the client's next request on it.
async fn drain(body: &mut StreamingBlob) {
    let mut left = DRAIN_BYTES_MAX;
    while let Some(Ok(piece)) = body.next().await {
        if piece.len() >= left {
            break;
        }
        left -= piece.len();
    }
}

/// A stream over a channel's receiver (the reader task's pieces).
struct ReceiverStream(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl Stream for ReceiverStream {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

fn objects_of(listing: &Listing, url: bool) -> (Vec<Object>, Vec<CommonPrefix>) {
    let enc = |s: &str| if url { url_encode(s) } else { s.to_string() };
    let objects = listing
        .objects
        .iter()
        .map(|(k, a, etag): &(String, FileAttr, Option<String>)| Object {
            key: Some(enc(k)),
            e_tag: etag.clone().map(ETag::Strong),
            size: Some(i64::try_from(a.size).unwrap_or(i64::MAX)),
            last_modified: Some(timestamp(a.mtime_ns)),
            storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
            ..Object::default()
        })
        .collect();
    let prefixes = listing.prefixes.iter().map(|p| CommonPrefix { prefix: Some(enc(p)) }).collect();
    (objects, prefixes)
}

fn is_url(e: &Option<EncodingType>) -> bool {
    e.as_ref().is_some_and(|e| e.as_str() == EncodingType::URL)
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn list_buckets(&self, req: S3Request<ListBucketsInput>) -> S3Result<S3Response<ListBucketsOutput>> {
        let cx = self.acting(&req)?;
        let me = cx.identity().uid;
        let fh = self.vfs.opendir(ROOT_INO).map_err(s3_err)?;
        let mut items = Vec::new();
        let r = self
            .vfs
            .readdir(&cx, fh, nasd_vfs::FIRST_ENTRY, |_, item| {
                items.push(item.clone());
                false
            })
            .await;
        self.vfs.releasedir(fh);
        r.map_err(s3_err)?;
        let mut buckets: Vec<Bucket> = items
            .into_iter()
            .filter_map(|i| i.entry.map(|e| (i.name, e.attr)))
            .filter(|(name, a)| a.kind == FileKind::Dir && a.uid == me && !name.starts_with('.'))
            .map(|(name, a)| Bucket {
                name: Some(name),
                creation_date: Some(timestamp(a.ctime_ns)),
                ..Bucket::default()
            })
            .collect();
        buckets.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(S3Response::new(ListBucketsOutput { buckets: Some(buckets), ..ListBucketsOutput::default() }))
    }

    async fn create_bucket(&self, req: S3Request<CreateBucketInput>) -> S3Result<S3Response<CreateBucketOutput>> {
        let cx = self.acting(&req)?;
        let name = &req.input.bucket;
        match self.vfs.mkdir(&cx, ROOT_INO, name, BUCKET_MODE).await {
            Ok(e) => {
                self.vfs.forget(e.attr.ino, 1);
                Ok(S3Response::new(CreateBucketOutput { location: Some(format!("/{name}")) }))
            }
            Err(e) if is(&e, FsStatus::Exists) => {
                let existing = self.bucket(&cx, name).await?;
                if existing.entry.attr.uid == cx.identity().uid {
                    Err(s3_error!(BucketAlreadyOwnedByYou))
                } else {
                    Err(s3_error!(BucketAlreadyExists))
                }
            }
            Err(e) => Err(s3_err(e)),
        }
    }

    async fn delete_bucket(&self, req: S3Request<DeleteBucketInput>) -> S3Result<S3Response<DeleteBucketOutput>> {
        let cx = self.acting(&req)?;
        match self.vfs.rmdir(&cx, ROOT_INO, &req.input.bucket).await {
            Ok(()) => Ok(S3Response::new(DeleteBucketOutput {})),
            Err(e) if is(&e, FsStatus::NotFound) => Err(s3_error!(NoSuchBucket)),
            Err(e) => Err(s3_err(e)),
        }
    }

    async fn head_bucket(&self, req: S3Request<HeadBucketInput>) -> S3Result<S3Response<HeadBucketOutput>> {
        let cx = self.acting(&req)?;
        let b = self.bucket(&cx, &req.input.bucket).await?;
        self.vfs.access(&cx, b.ino(), READ_SEARCH).await.map_err(s3_err)?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let cx = self.acting(&req)?;
        let _b = self.bucket(&cx, &req.input.bucket).await?;
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }

    async fn put_object(&self, req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
        let cx = self.acting(&req)?;
        let _slot = self.in_flight.take(cx.identity().uid)?;
        let expected = Expected::of_request(&req.headers, req.trailing_headers.clone())?;
        let input = req.input;
        let no_clobber = match &input.if_none_match {
            None => false,
            Some(ETagCondition::Any) => true,
            Some(_) => return Err(s3_error!(NotImplemented, "If-None-Match on PUT takes only '*'")),
        };
        if input.if_match.is_some() {
            return Err(s3_error!(NotImplemented, "If-Match on PUT is not supported"));
        }
        let meta = ObjectMeta {
            etag: String::new(),
            content_type: input.content_type.map(|c| c.to_string()),
            metadata: input.metadata.unwrap_or_default(),
            checksum: None,
            upload: None,
        };
        let mut body = input.body.unwrap_or_else(empty_body);
        if let Some(levels) = dir_marker(&input.key) {
            let made = match levels {
                Ok(levels) => self.put_marker(&cx, &input.bucket, &levels, &mut body).await,
                Err(e) => Err(e),
            };
            if made.is_err() {
                drain(&mut body).await;
            }
            made?;
            return Ok(S3Response::new(PutObjectOutput {
                e_tag: Some(ETag::Strong(EMPTY_MD5.into())),
                ..PutObjectOutput::default()
            }));
        }
        let written = self.write_object(&cx, &input.bucket, &input.key, &mut body, meta, expected, no_clobber).await;
        if written.is_err() {
            drain(&mut body).await;
        }
        let Some(stored) = written? else {
            return Err(s3_error!(PreconditionFailed, "the key exists (If-None-Match: *)"));
        };
        let output = PutObjectOutput { e_tag: Some(ETag::Strong(stored.etag.clone())), ..PutObjectOutput::default() };
        Ok(S3Response::new(with_checksum!(output, stored.checksum.as_ref())))
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let cx = self.acting(&req)?;
        let input = req.input;
        let (file, meta) = self.object(&cx, &input.bucket, &input.key).await?;
        let attr = file.entry.attr.clone();
        check_conditions(
            &meta,
            &attr,
            input.if_match.as_ref(),
            input.if_none_match.as_ref(),
            input.if_modified_since.as_ref(),
        )?;
        let size = object_size(&attr);
        let (range, content_range) = match input.range {
            None => (0..size, None),
            Some(r) => {
                let got = r.check(size).map_err(|_| s3_error!(InvalidRange))?;
                let cr = format!("bytes {}-{}/{}", got.start, got.end.saturating_sub(1), size);
                (got, Some(cr))
            }
        };
        let len = range.end - range.start;
        let checksum = asked_checksum(&meta, input.checksum_mode.as_ref(), content_range.is_none());
        let body = if attr.kind == FileKind::Dir { empty_body() } else { self.read_stream(&cx, file, range).await? };
        let (content_type, metadata) =
            meta.as_ref().map_or((None, None), |m| (m.content_type.clone(), Some(m.metadata.clone())));
        Ok(S3Response::new(GetObjectOutput {
            body: Some(body),
            content_length: Some(i64::try_from(len).unwrap_or(i64::MAX)),
            content_range,
            accept_ranges: Some("bytes".into()),
            last_modified: Some(timestamp(attr.mtime_ns)),
            e_tag: etag(&meta),
            content_type,
            metadata: metadata.filter(|m| !m.is_empty()),
            checksum_type: checksum.map(checksum_type),
            ..with_checksum!(GetObjectOutput::default(), checksum)
        }))
    }

    async fn head_object(&self, req: S3Request<HeadObjectInput>) -> S3Result<S3Response<HeadObjectOutput>> {
        let cx = self.acting(&req)?;
        let input = req.input;
        let (file, meta) = self.object(&cx, &input.bucket, &input.key).await?;
        let attr = file.entry.attr.clone();
        check_conditions(
            &meta,
            &attr,
            input.if_match.as_ref(),
            input.if_none_match.as_ref(),
            input.if_modified_since.as_ref(),
        )?;
        let (content_type, metadata) =
            meta.as_ref().map_or((None, None), |m| (m.content_type.clone(), Some(m.metadata.clone())));
        let checksum = asked_checksum(&meta, input.checksum_mode.as_ref(), true);
        Ok(S3Response::new(HeadObjectOutput {
            content_length: Some(i64::try_from(object_size(&attr)).unwrap_or(i64::MAX)),
            accept_ranges: Some("bytes".into()),
            last_modified: Some(timestamp(attr.mtime_ns)),
            e_tag: etag(&meta),
            content_type,
            metadata: metadata.filter(|m| !m.is_empty()),
            checksum_type: checksum.map(checksum_type),
            ..with_checksum!(HeadObjectOutput::default(), checksum)
        }))
    }

    async fn delete_object(&self, req: S3Request<DeleteObjectInput>) -> S3Result<S3Response<DeleteObjectOutput>> {
        let cx = self.acting(&req)?;
        self.delete_key(&cx, &req.input.bucket, &req.input.key).await?;
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn delete_objects(&self, req: S3Request<DeleteObjectsInput>) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let cx = self.acting(&req)?;
        let input = req.input;
        if input.delete.objects.len() > DELETE_OBJECTS_MAX {
            return Err(s3_error!(MalformedXML, "more than 1000 keys in one DeleteObjects"));
        }
        let _bucket = self.bucket(&cx, &input.bucket).await?;
        let quiet = input.delete.quiet.unwrap_or(false);
        let (mut deleted, mut errors) = (Vec::new(), Vec::new());
        for object in input.delete.objects {
            match self.delete_key(&cx, &input.bucket, &object.key).await {
                Ok(()) if quiet => {}
                Ok(()) => deleted.push(DeletedObject { key: Some(object.key), ..DeletedObject::default() }),
                Err(e) => errors.push(Error {
                    code: Some(e.code().as_str().to_string()),
                    key: Some(object.key),
                    message: e.message().map(str::to_string),
                    version_id: None,
                }),
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: Some(errors).filter(|e| !e.is_empty()),
            ..DeleteObjectsOutput::default()
        }))
    }

    async fn copy_object(&self, req: S3Request<CopyObjectInput>) -> S3Result<S3Response<CopyObjectOutput>> {
        let cx = self.acting(&req)?;
        let _slot = self.in_flight.take(cx.identity().uid)?;
        let input = req.input;
        let CopySource::Bucket { bucket: src_bucket, key: src_key, version_id: None } = &input.copy_source else {
            return Err(s3_error!(NotImplemented, "only copies from a bucket and key, without versions"));
        };
        let (file, src_meta) = self.object(&cx, src_bucket, src_key).await?;
        let size = file.entry.attr.size;
        let replace = input.metadata_directive.as_ref().is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        let meta = if replace {
            ObjectMeta {
                etag: String::new(),
                content_type: input.content_type.map(|c| c.to_string()),
                metadata: input.metadata.unwrap_or_default(),
                checksum: None,
                upload: None,
            }
        } else {
            // The copy is no upload's work (a retried completion would take it for its own).
            ObjectMeta { upload: None, ..src_meta.unwrap_or_default() }
        };
        let body = self.read_stream(&cx, file, 0..size).await?;
        let stored = self.write_object(&cx, &input.bucket, &input.key, body, meta, Expected::nothing(), false).await?;
        let result = CopyObjectResult {
            e_tag: stored.map(|m| ETag::Strong(m.etag)),
            last_modified: Some(Timestamp::from(std::time::SystemTime::now())),
            ..CopyObjectResult::default()
        };
        Ok(S3Response::new(CopyObjectOutput { copy_object_result: Some(result), ..CopyObjectOutput::default() }))
    }

    async fn list_objects_v2(&self, req: S3Request<ListObjectsV2Input>) -> S3Result<S3Response<ListObjectsV2Output>> {
        let cx = self.acting(&req)?;
        let input = req.input;
        let prefix = input.prefix.clone().unwrap_or_default();
        let token = match &input.continuation_token {
            Some(t) => Some(decode_token(t)?),
            None => None,
        };
        let after = token.clone().or_else(|| input.start_after.clone()).unwrap_or_default();
        let listing =
            self.listing(&cx, &input.bucket, &prefix, input.delimiter.as_deref(), &after, input.max_keys).await?;
        let url = is_url(&input.encoding_type);
        let (contents, prefixes) = objects_of(&listing, url);
        let next = if listing.truncated { listing.last().map(|l| hex::encode(l.as_bytes())) } else { None };
        let key_count = i32::try_from(contents.len() + prefixes.len()).unwrap_or(i32::MAX);
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: Some(if url { url_encode(&prefix) } else { prefix }),
            delimiter: input.delimiter,
            max_keys: Some(input.max_keys.unwrap_or(LIST_KEYS_MAX as i32)),
            key_count: Some(key_count),
            continuation_token: input.continuation_token,
            next_continuation_token: next,
            start_after: input.start_after,
            is_truncated: Some(listing.truncated),
            contents: Some(contents),
            common_prefixes: Some(prefixes).filter(|p| !p.is_empty()),
            encoding_type: input.encoding_type,
            ..ListObjectsV2Output::default()
        }))
    }

    async fn list_objects(&self, req: S3Request<ListObjectsInput>) -> S3Result<S3Response<ListObjectsOutput>> {
        let cx = self.acting(&req)?;
        let input = req.input;
        let prefix = input.prefix.clone().unwrap_or_default();
        let after = input.marker.clone().unwrap_or_default();
        let listing =
            self.listing(&cx, &input.bucket, &prefix, input.delimiter.as_deref(), &after, input.max_keys).await?;
        let url = is_url(&input.encoding_type);
        let (contents, prefixes) = objects_of(&listing, url);
        let next = if listing.truncated {
            listing.last().map(|l| if url { url_encode(l) } else { l.to_string() })
        } else {
            None
        };
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(input.bucket),
            prefix: Some(if url { url_encode(&prefix) } else { prefix }),
            delimiter: input.delimiter,
            marker: input.marker,
            max_keys: Some(input.max_keys.unwrap_or(LIST_KEYS_MAX as i32)),
            next_marker: next,
            is_truncated: Some(listing.truncated),
            contents: Some(contents),
            common_prefixes: Some(prefixes).filter(|p| !p.is_empty()),
            encoding_type: input.encoding_type,
            ..ListObjectsOutput::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let cx = self.acting(&req)?;
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        let id = self.mp_create(&cx, req.input).await?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(bucket),
            key: Some(key),
            upload_id: Some(id),
            ..CreateMultipartUploadOutput::default()
        }))
    }

    async fn upload_part(&self, req: S3Request<UploadPartInput>) -> S3Result<S3Response<UploadPartOutput>> {
        let cx = self.acting(&req)?;
        let _slot = self.in_flight.take(cx.identity().uid)?;
        let expected = Expected::of_request(&req.headers, req.trailing_headers.clone())?;
        let mut input = req.input;
        let mut body = input.body.take().unwrap_or_else(empty_body);
        let written = self.mp_upload_part(&cx, input, &mut body, expected).await;
        if written.is_err() {
            drain(&mut body).await;
        }
        let stored = written?;
        let output = UploadPartOutput { e_tag: Some(ETag::Strong(stored.etag.clone())), ..UploadPartOutput::default() };
        Ok(S3Response::new(with_checksum!(output, stored.checksum.as_ref())))
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let cx = self.acting(&req)?;
        let _slot = self.in_flight.take(cx.identity().uid)?;
        let etag = self.mp_upload_part_copy(&cx, req.input).await?;
        let result = CopyPartResult {
            e_tag: Some(ETag::Strong(etag)),
            last_modified: Some(Timestamp::from(std::time::SystemTime::now())),
            ..CopyPartResult::default()
        };
        Ok(S3Response::new(UploadPartCopyOutput { copy_part_result: Some(result), ..UploadPartCopyOutput::default() }))
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let cx = self.acting(&req)?;
        Ok(S3Response::new(self.mp_list_uploads(&cx, req.input).await?))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let cx = self.acting(&req)?;
        let _slot = self.in_flight.take(cx.identity().uid)?;
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        // Run to its end even if the client goes away meanwhile: a completion cut off halfway
        // would leave the object published and the upload behind, and its retry refused.
        let (me, input) = (self.clone(), req.input);
        let completing = tokio::spawn(async move { me.mp_complete(&cx, input).await });
        let stored = completing.await.map_err(|_| s3_error!(InternalError, "the completion failed"))??;
        let output = CompleteMultipartUploadOutput {
            bucket: Some(bucket),
            key: Some(key),
            e_tag: Some(ETag::Strong(stored.etag.clone())),
            checksum_type: stored.checksum.as_ref().map(checksum_type),
            ..CompleteMultipartUploadOutput::default()
        };
        Ok(S3Response::new(with_checksum!(output, stored.checksum.as_ref())))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let cx = self.acting(&req)?;
        self.mp_abort(&cx, req.input).await?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    async fn list_parts(&self, req: S3Request<ListPartsInput>) -> S3Result<S3Response<ListPartsOutput>> {
        let cx = self.acting(&req)?;
        Ok(S3Response::new(self.mp_list_parts(&cx, req.input).await?))
    }
}

/// The checksum a GET or HEAD returns: the stored one, if the client asked
/// (`x-amz-checksum-mode: ENABLED`) and reads the `whole` object.
fn asked_checksum<'m>(
    meta: &'m Option<ObjectMeta>,
    mode: Option<&ChecksumMode>,
    whole: bool,
) -> Option<&'m StoredChecksum> {
    let asked = mode.is_some_and(|m| m.as_str().eq_ignore_ascii_case(ChecksumMode::ENABLED));
    meta.as_ref().and_then(|m| m.checksum.as_ref()).filter(|_| asked && whole)
}

/// `COMPOSITE` for a multipart object's checksum, else `FULL_OBJECT`.
fn checksum_type(c: &StoredChecksum) -> ChecksumType {
    ChecksumType::from_static(if c.is_composite() { ChecksumType::COMPOSITE } else { ChecksumType::FULL_OBJECT })
}

/// A continuation token: the hex of the last key or prefix returned.
fn decode_token(token: &str) -> S3Result<String> {
    let bytes =
        hex::decode(token).map_err(|_| s3_error!(InvalidArgument, "the continuation token is not this gateway's"))?;
    String::from_utf8(bytes).map_err(|_| s3_error!(InvalidArgument, "the continuation token is not this gateway's"))
}

/// If-Match, If-None-Match, If-Modified-Since of a GET or HEAD.
pub(crate) fn check_conditions(
    meta: &Option<ObjectMeta>,
    attr: &FileAttr,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
    if_modified_since: Option<&Timestamp>,
) -> S3Result<()> {
    let current = etag(meta);
    let matches = |c: &ETagCondition| match c {
        ETagCondition::Any => true,
        ETagCondition::ETag(t) => current.as_ref().is_some_and(|cur| cur.strong_cmp(t)),
    };
    if let Some(c) = if_match {
        if !matches(c) {
            return Err(s3_error!(PreconditionFailed));
        }
    }
    if let Some(c) = if_none_match {
        if matches(c) {
            return Err(s3_error!(NotModified));
        }
    } else if let Some(since) = if_modified_since {
        // Last-Modified is shown in whole seconds: compare in them.
        if timestamp(attr.mtime_ns.div_euclid(1_000_000_000) * 1_000_000_000) <= *since {
            return Err(s3_error!(NotModified));
        }
    }
    Ok(())
}
