//! Multipart uploads. An upload is a directory `BUCKET/.nasd-s3-uploads/ID`
//! (the uploads directory sticky and world-writable like `/tmp`, each
//! upload `0700`, made as the uploading user), its key, Content-Type and
//! metadata in the directory's [`META_XATTR`](crate::META_XATTR).
//!
//! **Parts written in place.** aws-cli, boto3, rclone and s3fs send every
//! part but the last at one size. The first part to arrive at least the
//! gateway's part minimum long
//! ([`PART_BYTES_MIN_DEFAULT`](crate::PART_BYTES_MIN_DEFAULT), 5 MiB) with
//! its length known (`Content-Length`, or the decoded length of an
//! `aws-chunked` body) fixes the upload's part size `P`, recorded
//! create-only in the directory's `PART_SIZE_XATTR`, so concurrent first
//! parts agree. A part `N` of length `P` is written at `(N-1)·P` of one
//! staging file `data` in the upload's directory, committed, and only then
//! recorded: `part-NNNNN`, an empty file whose `META_XATTR` holds its ETag,
//! its checksum (`checksum.rs`) and where it lies in `data`, put in place
//! by a rename once whole.
//!
//! **One writer per region, ever.** The first send of part `N` claims its
//! region (`claim-NNNNN`, a directory made exclusively — the name space
//! decides, so this holds across gateway processes sharing the cluster) and
//! only the claimant writes there. A part sent again (a client's retry on a
//! timeout), or sent twice at once, is written as a file `part-NNNNN` of
//! its own under a temporary name and renamed over the record only when
//! whole and verified: the copy acknowledged before stays whole whatever
//! befalls the new one (cut off, short, a wrong checksum). A part of
//! another length (the last, or an unequal client's), or of unknown length,
//! is such a file too. Locks by upload and part (`locks.rs`, within one
//! process) only order requests a gateway serves; correctness does not rest
//! on them.
//!
//! **Completion** checks S3's limits — 1 to [`PARTS_MAX`] parts, in
//! ascending order, each but the last at least the part minimum (else
//! `EntityTooSmall`), at most [`MULTIPART_OBJECT_BYTES_MAX`] in all — and
//! each part's ETag and any checksum the completion names, and makes the
//! object's ETag (MD5 of the parts' MD5s, `-N`) and, when every part
//! carries a checksum of one algorithm, S3's composite checksum. When the
//! parts named are `1..=k` in place, with perhaps a last part of its own,
//! it marks the upload `completing` (no region is claimed after that) and,
//! if no region past `k` is claimed (a part there may still be written, or
//! its bytes be on their way), publishes `data` itself: the last part's
//! bytes (at most one part) copied to `k·P`, `data` cut to the object's
//! size, given the object's metadata, committed and renamed to the key —
//! readers see the old object or the whole new one; no part record is
//! touched, so a completion that fails is retried as it was. The drives
//! then write each uploaded byte once (1.5 bytes per byte on `rs:4+2`, its
//! redundancy; asserted by `aws_cli_copies_a_large_file_with_bounded_gateway_memory`,
//! which measured 3.0 when every completion copied). Any other shape (gaps
//! in the numbers, a part sent again, a first part that guessed `P` wrong,
//! parts of unknown length, parts past those named) streams the parts, in
//! order, into the object through the same temporary-name-and-rename as a
//! PUT: correct, at the cost of one copy. Then the upload is removed. The
//! completion runs in a task of its own, to its end even if its client goes
//! away, and the object records its upload id: a completion retried after
//! its answer was lost answers as the first did.
//!
//! **Crashes.** Until the rename nothing is visible at the key; a gateway
//! killed before it leaves `data` and records in the upload's directory
//! (a write transaction cut short is rolled back by the manager), which
//! AbortMultipartUpload or the sweep for abandoned uploads
//! ([`Gateway::expire_uploads`]) removes, and their space with them. Killed
//! after it, the object is whole and the upload's leftovers are swept.
//!
//! UploadPartCopy writes a part from (a range of) an object the caller may
//! read, in place like an UploadPart; ListMultipartUploads lists the
//! uploads whose directory the caller may read — its own.

use crate::checksum::{Algorithm, Expected, StoredChecksum};
use crate::ops::{check_metadata, is, s3_err, timestamp, with_checksum, Held, ObjectMeta, OBJECT_MODE};
use crate::paths::{object_path, UPLOADS_DIR};
use crate::{Gateway, META_XATTR};
use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use md5::{Digest, Md5};
use nasd_fs::{FileKind, FsClient, FsStatus, XattrMode};
use nasd_vfs::CreateFlags;
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Parts one upload takes at most (S3's limit).
pub const PARTS_MAX: i32 = 10_000;
/// Largest object a multipart upload makes (S3's 5 TiB).
pub const MULTIPART_OBJECT_BYTES_MAX: u64 = 5 << 40;
/// Uploads one ListMultipartUploads page lists at most (S3's limit).
pub const LIST_UPLOADS_MAX: i32 = 1000;
/// Mode of the uploads directory of a bucket.
const UPLOADS_MODE: u32 = 0o1777;
/// Mode of one upload's directory.
const UPLOAD_MODE: u32 = 0o700;

/// Name of an upload's staging file: its parts of the upload's part size,
/// each at `(N-1)·P`.
const DATA_NAME: &str = "data";
/// Extended attribute of an upload's directory: its part size `P`
/// (decimal), set once by the first part that fixes it.
const PART_SIZE_XATTR: &str = "user.nasd.s3.part-size";

/// What a part's record (or a part's own file) keeps in its
/// [`META_XATTR`]: the part's ETag and checksum, and for a part written in
/// place, where it lies in the upload's `DATA_NAME`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct PartMeta {
    #[serde(flatten)]
    object: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    in_place: Option<Placement>,
}

/// Where a part written in place lies in its upload's staging file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Placement {
    offset: u64,
    size: u64,
}

/// Where a completion publishes: the object's bucket and path, and the upload.
struct Target<'a> {
    bucket: &'a str,
    levels: &'a [&'a str],
    upload: &'a Held,
}

/// A part a completion names, found in its upload.
struct FoundPart {
    number: i32,
    /// Its record (in place) or its own file, held.
    file: Held,
    meta: PartMeta,
}

impl FoundPart {
    fn size(&self) -> u64 {
        self.meta.in_place.map_or(self.file.entry.attr.size, |p| p.size)
    }
}

/// How many of `parts` (a completion's, in order), from the first, are
/// parts `1, 2, …` written in place one after the other.
fn in_place_run(parts: &[FoundPart]) -> usize {
    let Some(first) = parts.first().and_then(|p| p.meta.in_place) else { return 0 };
    let size = first.size;
    parts
        .iter()
        .enumerate()
        .take_while(|(i, p)| {
            p.number == *i as i32 + 1 && p.meta.in_place == Some(Placement { offset: *i as u64 * size, size })
        })
        .count()
}

/// An open descriptor of the file-system layer, released when dropped
/// unless [`release`](Self::release)d: a request cut off (its client gone,
/// its future dropped) leaves no file open in the gateway.
struct OpenFh {
    vfs: nasd_vfs::Vfs,
    fh: Option<u64>,
}

impl OpenFh {
    fn new(vfs: &nasd_vfs::Vfs, fh: u64) -> OpenFh {
        OpenFh { vfs: vfs.clone(), fh: Some(fh) }
    }

    fn fh(&self) -> u64 {
        self.fh.expect("an OpenFh is open until released")
    }

    async fn release(mut self) -> Result<(), nasd_vfs::VfsError> {
        let fh = self.fh.take().expect("released once");
        self.vfs.release(fh).await
    }
}

impl Drop for OpenFh {
    fn drop(&mut self) {
        let Some(fh) = self.fh.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let vfs = self.vfs.clone();
        runtime.spawn(async move {
            if let Err(e) = vfs.release(fh).await {
                tracing::debug!(error = %e, "closing the file of a request cut off failed");
            }
        });
    }
}

/// Most bytes a part written in place is buffered in before it goes to
/// the staging file: a whole stripe of the file's layout up to this
/// (`rs:4+2` at the default 1 MiB unit: 4 MiB; `rs:8+3`: 8 MiB), else [`IO_CHUNK`](crate::IO_CHUNK)
/// pieces. Parts written at once share one open file, whose write-behind
/// gathers only contiguous writes: a part's piece smaller than a stripe
/// would be written as part of a stripe, its parity read and written
/// again each time (the drives wrote 2.8 bytes per byte so). Costs this
/// much per part in flight ([`UPLOADS_IN_FLIGHT_MAX`](crate::UPLOADS_IN_FLIGHT_MAX) at most).
pub const IN_PLACE_PIECE_BYTES_MAX: usize = 8 << 20;

const _: () = assert!(IN_PLACE_PIECE_BYTES_MAX >= crate::IO_CHUNK);

/// The piece a part written in place is buffered in, for a file whose
/// stripes hold `stripe_bytes`.
fn in_place_piece_bytes(stripe_bytes: u64) -> usize {
    match usize::try_from(stripe_bytes) {
        Ok(s) if (1..=IN_PLACE_PIECE_BYTES_MAX).contains(&s) => s * (crate::IO_CHUNK / s).max(1),
        _ => crate::IO_CHUNK,
    }
}

/// What an upload's directory records.
#[derive(Debug, Serialize, Deserialize)]
struct UploadMeta {
    key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content_type: Option<String>,
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    metadata: HashMap<String, String>,
}

/// Which part of which upload a request writes.
#[derive(Clone, Copy)]
struct PartRef<'a> {
    bucket: &'a str,
    key: &'a str,
    id: &'a str,
    number: i32,
}

fn part_name(n: i32) -> String {
    format!("part-{n:05}")
}

/// Prefix of the names that claim a part's region of the staging file.
const CLAIM_PREFIX: &str = "claim-";
/// Name of the directory that marks an upload being completed.
const COMPLETING_NAME: &str = "completing";

fn claim_name(n: i32) -> String {
    format!("{CLAIM_PREFIX}{n:05}")
}

fn check_upload_id(id: &str) -> S3Result<()> {
    if id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(s3_error!(NoSuchUpload))
    }
}

/// A completion's checksum for a part, if it names one, must be the one
/// the part was uploaded with (`InvalidPart`, as S3 answers).
fn check_part_checksum(part: &CompletedPart, stored: Option<&StoredChecksum>) -> S3Result<()> {
    let named = [
        (Algorithm::Crc32, &part.checksum_crc32),
        (Algorithm::Crc32c, &part.checksum_crc32c),
        (Algorithm::Crc64Nvme, &part.checksum_crc64nvme),
        (Algorithm::Sha1, &part.checksum_sha1),
        (Algorithm::Sha256, &part.checksum_sha256),
    ];
    for (algorithm, value) in named {
        let Some(value) = value else { continue };
        if stored.is_none_or(|s| s.algorithm != algorithm || s.value != *value) {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidPart,
                format!(
                    "part {}'s {} is not the one it was uploaded with",
                    part.part_number.unwrap_or(0),
                    algorithm.name()
                ),
            ));
        }
    }
    Ok(())
}

fn check_part_number(n: i32) -> S3Result<()> {
    if (1..=PARTS_MAX).contains(&n) {
        Ok(())
    } else {
        Err(s3_error!(InvalidArgument, "part numbers run from 1 to 10000"))
    }
}

impl Gateway {
    /// CreateMultipartUpload: a new upload id.
    pub(crate) async fn mp_create(&self, cx: &FsClient, input: CreateMultipartUploadInput) -> S3Result<String> {
        object_path(&input.key)?;
        let meta = UploadMeta {
            key: input.key,
            content_type: input.content_type,
            metadata: input.metadata.unwrap_or_default(),
        };
        check_metadata(&ObjectMeta { metadata: meta.metadata.clone(), ..ObjectMeta::default() })?;
        let bucket = self.bucket(cx, &input.bucket).await?;
        let uploads = match self.vfs.lookup(cx, bucket.ino(), UPLOADS_DIR).await {
            Ok(e) => self.held(e),
            Err(e) if is(&e, FsStatus::NotFound) => {
                match self.vfs.mkdir(cx, bucket.ino(), UPLOADS_DIR, UPLOADS_MODE).await {
                    Ok(e) => self.held(e),
                    Err(e) if is(&e, FsStatus::Exists) => {
                        self.held(self.vfs.lookup(cx, bucket.ino(), UPLOADS_DIR).await.map_err(s3_err)?)
                    }
                    Err(e) => return Err(s3_err(e)),
                }
            }
            Err(e) => return Err(s3_err(e)),
        };
        self.count_open_uploads().await;
        let uid = cx.identity().uid;
        self.open_uploads.open(uid)?;
        let id = hex::encode(nasd_crypto::random_bytes::<16>());
        let upload = match self.vfs.mkdir(cx, uploads.ino(), &id, UPLOAD_MODE).await {
            Ok(e) => self.held(e),
            Err(e) => {
                self.open_uploads.closed(uid);
                return Err(s3_err(e));
            }
        };
        let value = serde_json::to_vec(&meta).map_err(|_| s3_error!(InternalError))?;
        // Made without its record, it is never listed nor completed: the sweep removes it.
        self.vfs.setxattr(cx, upload.ino(), META_XATTR, &value, XattrMode::Either).await.map_err(s3_err)?;
        Ok(id)
    }

    /// The directory of upload `id` of `key`, held, and what it records.
    async fn upload(&self, cx: &FsClient, bucket: &str, key: &str, id: &str) -> S3Result<(Held, UploadMeta)> {
        check_upload_id(id)?;
        let b = self.bucket(cx, bucket).await?;
        let dir = self.walk(cx, b, &[UPLOADS_DIR, id], false).await.map_err(|e| {
            if *e.code() == s3s::S3ErrorCode::AccessDenied {
                e
            } else {
                s3_error!(NoSuchUpload)
            }
        })?;
        let value = self.vfs.getxattr(cx, dir.ino(), META_XATTR).await.map_err(|_| s3_error!(NoSuchUpload))?;
        let meta: UploadMeta = serde_json::from_slice(&value).map_err(|_| s3_error!(NoSuchUpload))?;
        if meta.key != key {
            return Err(s3_error!(NoSuchUpload));
        }
        Ok((dir, meta))
    }

    /// UploadPart: the part's ETag and checksum, checked against `expected`.
    pub(crate) async fn mp_upload_part(
        &self,
        cx: &FsClient,
        input: UploadPartInput,
        body: &mut StreamingBlob,
        expected: Expected,
    ) -> S3Result<ObjectMeta> {
        check_part_number(input.part_number)?;
        let len = input.content_length.and_then(|l| u64::try_from(l).ok());
        let part = PartRef { bucket: &input.bucket, key: &input.key, id: &input.upload_id, number: input.part_number };
        self.write_part(cx, part, body, len, expected).await
    }

    /// UploadPartCopy: part `input.part_number` made of (a range of) an
    /// existing object, read as the caller; the part's ETag.
    pub(crate) async fn mp_upload_part_copy(&self, cx: &FsClient, input: UploadPartCopyInput) -> S3Result<String> {
        check_part_number(input.part_number)?;
        let CopySource::Bucket { bucket: src_bucket, key: src_key, version_id: None } = &input.copy_source else {
            return Err(s3_error!(NotImplemented, "only copies from a bucket and key, without versions"));
        };
        drop(self.upload(cx, &input.bucket, &input.key, &input.upload_id).await?);
        let (file, src_meta) = self.object(cx, src_bucket, src_key).await?;
        let conditions = crate::ops::check_conditions(
            &src_meta,
            &file.entry.attr,
            input.copy_source_if_match.as_ref(),
            input.copy_source_if_none_match.as_ref(),
            input.copy_source_if_modified_since.as_ref(),
        );
        // A copy's failed condition is a failed precondition, never "not modified".
        conditions.map_err(|_| s3_error!(PreconditionFailed))?;
        let size = file.entry.attr.size;
        let range = match &input.copy_source_range {
            None => 0..size,
            Some(r) => {
                let parsed = Range::parse(r)
                    .map_err(|_| s3_error!(InvalidArgument, "x-amz-copy-source-range: bytes=FIRST-LAST"))?;
                parsed.check(size).map_err(|_| s3_error!(InvalidRange))?
            }
        };
        let len = range.end - range.start;
        let body = self.read_stream(cx, file, range).await?;
        let part = PartRef { bucket: &input.bucket, key: &input.key, id: &input.upload_id, number: input.part_number };
        let stored = self.write_part(cx, part, body, Some(len), Expected::nothing()).await?;
        Ok(stored.etag)
    }

    /// Writes part `part` of `len` bytes (if known) from `body`: in place
    /// when `len` is the upload's part size, else as a file of its own.
    async fn write_part<S, E>(
        &self,
        cx: &FsClient,
        part: PartRef<'_>,
        body: S,
        len: Option<u64>,
        expected: Expected,
    ) -> S3Result<ObjectMeta>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        check_upload_id(part.id)?;
        // No completion while parts are written; one writer per part number.
        let _upload_lock = self.upload_locks.shared(part.id).await;
        let _part_lock = self.upload_locks.alone(&format!("{}/{}", part.id, part.number)).await;
        let (upload, _) = self.upload(cx, part.bucket, part.key, part.id).await?;
        let size = match len {
            Some(len) => self.part_size(cx, &upload, len).await?,
            None => None,
        };
        let in_place =
            size.filter(|&p| Some(p) == len && u64::from(part.number.unsigned_abs()) * p <= MULTIPART_OBJECT_BYTES_MAX);
        if let Some(p) = in_place {
            if self.claim_region(cx, &upload, part.number).await? {
                return self.write_part_in_place(cx, &upload, part.id, part.number, p, body, expected).await;
            }
        }
        drop(upload);
        let name = part_name(part.number);
        let levels = [UPLOADS_DIR, part.id, name.as_str()];
        let stored = self.write_levels(cx, part.bucket, &levels, body, ObjectMeta::default(), expected, false).await?;
        stored.ok_or_else(|| s3_error!(InternalError))
    }

    /// The upload's part size: the one recorded, else `len` if it is at
    /// least the part minimum (recorded create-only: of two first parts at
    /// once, both get the one that was recorded); `None` while unfixed.
    async fn part_size(&self, cx: &FsClient, upload: &Held, len: u64) -> S3Result<Option<u64>> {
        if let Some(p) = self.recorded_part_size(cx, upload).await? {
            return Ok(Some(p));
        }
        if len < self.part_bytes_min.max(1) || len > crate::OBJECT_BYTES_MAX {
            return Ok(None);
        }
        let value = len.to_string();
        match self.vfs.setxattr(cx, upload.ino(), PART_SIZE_XATTR, value.as_bytes(), XattrMode::Create).await {
            Ok(()) => Ok(Some(len)),
            Err(e) if is(&e, FsStatus::Exists) => self.recorded_part_size(cx, upload).await,
            Err(e) => Err(s3_err(e)),
        }
    }

    async fn recorded_part_size(&self, cx: &FsClient, upload: &Held) -> S3Result<Option<u64>> {
        match self.vfs.getxattr(cx, upload.ino(), PART_SIZE_XATTR).await {
            Ok(v) => Ok(std::str::from_utf8(&v).ok().and_then(|v| v.parse().ok())),
            Err(e) if is(&e, FsStatus::NoXattr) || e.errno() == 61 => Ok(None),
            Err(e) => Err(s3_err(e)),
        }
    }

    /// Writes part `n`, `p` bytes (the upload's part size), at `(n-1)·p` of
    /// the upload's staging file, commits it, then records it.
    #[allow(clippy::too_many_arguments)]
    async fn write_part_in_place<S, E>(
        &self,
        cx: &FsClient,
        upload: &Held,
        id: &str,
        n: i32,
        p: u64,
        body: S,
        expected: Expected,
    ) -> S3Result<ObjectMeta>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let offset = u64::from(n.unsigned_abs() - 1) * p;
        let (data, fh) = self.open_data(cx, upload, id).await?;
        let mut hasher = expected.hasher();
        let piece = self.vfs.layout_of(fh.fh()).map_or(crate::IO_CHUNK, |l| in_place_piece_bytes(l.stripe_bytes()));
        let written = self.fill(fh.fh(), offset..offset + p, piece, body, hasher.as_mut()).await;
        // Checked before the commit: a body that fails its checksum is not committed by this request.
        let verified = match written {
            Ok((_, len)) if len != p => Err(s3_error!(IncompleteBody, "the body is shorter than its Content-Length")),
            Ok((md5, _)) => expected.verify(&md5, hasher.map(|h| h.finalize())).map(|checksum| (md5, checksum)),
            Err(e) => Err(e),
        };
        let committed = match verified {
            Ok(v) => self.vfs.commit(fh.fh()).await.map(|()| v).map_err(s3_err),
            Err(e) => Err(e),
        };
        let released = fh.release().await;
        drop(data);
        let (md5, checksum) = committed?;
        released.map_err(s3_err)?;
        let object = ObjectMeta { etag: hex::encode(md5), checksum, ..ObjectMeta::default() };
        let meta = PartMeta { object, in_place: Some(Placement { offset, size: p }) };
        self.write_record(cx, upload, n, &meta).await?;
        Ok(meta.object)
    }

    /// Opens upload `id`'s staging file for writing, made if absent: held,
    /// and its descriptor. The parts written at once share one open file
    /// (`nasd_vfs`), so one write transaction: the manager lets one writer
    /// hold a file at a time.
    async fn open_data(&self, cx: &FsClient, upload: &Held, id: &str) -> S3Result<(Held, OpenFh)> {
        let _opening = self.upload_locks.alone(&format!("{id}/{DATA_NAME}")).await;
        let made = match self.vfs.lookup(cx, upload.ino(), DATA_NAME).await {
            Ok(e) => Some(self.held(e)),
            Err(e) if is(&e, FsStatus::NotFound) => None,
            Err(e) => return Err(s3_err(e)),
        };
        if made.is_none() {
            let how = CreateFlags { exclusive: true, truncate: false, write: true };
            match self.vfs.create(cx, upload.ino(), DATA_NAME, OBJECT_MODE, how).await {
                Ok((e, opened)) => return Ok((self.held(e), OpenFh::new(&self.vfs, opened.fh))),
                Err(e) if is(&e, FsStatus::Exists) => {}
                Err(e) => return Err(s3_err(e)),
            }
        }
        let data = match made {
            Some(data) => data,
            None => self.held(self.vfs.lookup(cx, upload.ino(), DATA_NAME).await.map_err(s3_err)?),
        };
        let opened = self.vfs.open(cx, data.ino(), true).await.map_err(s3_err)?;
        Ok((data, OpenFh::new(&self.vfs, opened.fh)))
    }

    /// Claims part `n`'s region of the staging file for this request:
    /// `true` if it may write the part in place. A region is claimed once
    /// (`claim-NNNNN`, made exclusively), by the first send of its part
    /// number, for the upload's life: a part sent again, or sent twice at
    /// once — through this gateway or another —, is written as a file of
    /// its own, so the copy acknowledged before stays whole whatever befalls
    /// the new one, and no two requests ever write one region. Refused
    /// too once a completion has begun (`completing`, checked after the
    /// claim: a completion that listed the claims before this one was made
    /// is seen here).
    async fn claim_region(&self, cx: &FsClient, upload: &Held, n: i32) -> S3Result<bool> {
        match self.vfs.mkdir(cx, upload.ino(), &claim_name(n), UPLOAD_MODE).await {
            Ok(e) => drop(self.held(e)),
            Err(e) if is(&e, FsStatus::Exists) => return Ok(false),
            Err(e) => return Err(s3_err(e)),
        }
        match self.vfs.lookup(cx, upload.ino(), COMPLETING_NAME).await {
            Ok(e) => {
                drop(self.held(e));
                Ok(false)
            }
            Err(e) if is(&e, FsStatus::NotFound) => Ok(true),
            Err(e) => Err(s3_err(e)),
        }
    }

    /// Marks `upload` as being completed (`completing`, kept until the
    /// upload goes): from then on no part is written in place
    /// ([`claim_region`](Self::claim_region)).
    async fn mark_completing(&self, cx: &FsClient, upload: &Held) -> S3Result<()> {
        match self.vfs.mkdir(cx, upload.ino(), COMPLETING_NAME, UPLOAD_MODE).await {
            Ok(e) => {
                drop(self.held(e));
                Ok(())
            }
            Err(e) if is(&e, FsStatus::Exists) => Ok(()),
            Err(e) => Err(s3_err(e)),
        }
    }

    /// Whether a region past part `k` is claimed: a part being written
    /// there, or one that was (its bytes possibly still on their way), would
    /// land in or be cut from a staging file published now.
    async fn claimed_past(&self, cx: &FsClient, upload: &Held, k: usize) -> S3Result<bool> {
        let entries = self.entries(cx, upload.ino()).await?;
        Ok(entries.iter().any(|(name, _)| {
            let n = name.strip_prefix(CLAIM_PREFIX).and_then(|n| n.parse::<usize>().ok());
            n.is_some_and(|n| n > k)
        }))
    }

    /// Puts part `n`'s record (an empty file with `meta`) in place, whole.
    async fn write_record(&self, cx: &FsClient, upload: &Held, n: i32, meta: &PartMeta) -> S3Result<()> {
        let name = part_name(n);
        let temp = nasd_vfs::temp_name(&name);
        let value = serde_json::to_vec(meta).map_err(|_| s3_error!(InternalError))?;
        let record = self.vfs.begin_replace(cx, upload.ino(), &name, &temp, OBJECT_MODE).await.map_err(s3_err)?;
        if let Err(e) = self.vfs.setxattr(cx, record.entry().attr.ino, META_XATTR, &value, XattrMode::Either).await {
            if let Err(gone) = record.abandon().await {
                tracing::warn!(error = %gone, "removing an unfinished part record failed");
            }
            return Err(s3_err(e));
        }
        if let Err(e) = record.publish(false).await {
            if let Err(gone) = self.vfs.unlink(cx, upload.ino(), &temp).await {
                tracing::warn!(error = %gone, "removing an unpublished part record failed");
            }
            return Err(s3_err(e));
        }
        Ok(())
    }

    /// Part `n` of `upload` as a completion finds it: `None` if absent.
    async fn found_part(&self, cx: &FsClient, upload: &Held, n: i32) -> S3Result<Option<FoundPart>> {
        let file = match self.vfs.lookup(cx, upload.ino(), &part_name(n)).await {
            Ok(e) => self.held(e),
            Err(e) if is(&e, FsStatus::NotFound) => return Ok(None),
            Err(e) => return Err(s3_err(e)),
        };
        let meta = match self.vfs.getxattr(cx, file.ino(), META_XATTR).await {
            Ok(v) => serde_json::from_slice::<PartMeta>(&v).ok(),
            Err(e) if is(&e, FsStatus::NoXattr) || e.errno() == 61 => None,
            Err(e) => return Err(s3_err(e)),
        };
        Ok(meta.map(|meta| FoundPart { number: n, file, meta }))
    }

    /// ListMultipartUploads: the uploads in progress in a bucket that the
    /// caller may see (each upload is its user's, `0700`), by key, then
    /// initiation, then id; `prefix`, `delimiter`, the key and upload-id
    /// markers and at most [`LIST_UPLOADS_MAX`] per page.
    pub(crate) async fn mp_list_uploads(
        &self,
        cx: &FsClient,
        input: ListMultipartUploadsInput,
    ) -> S3Result<ListMultipartUploadsOutput> {
        let b = self.bucket(cx, &input.bucket).await?;
        let max = input.max_uploads.unwrap_or(LIST_UPLOADS_MAX).clamp(0, LIST_UPLOADS_MAX);
        let prefix = input.prefix.clone().unwrap_or_default();
        let mut found = Vec::new();
        if let Ok(uploads) = self.walk(cx, b, &[UPLOADS_DIR], false).await {
            for (id, e) in self.entries(cx, uploads.ino()).await? {
                if check_upload_id(&id).is_err() || e.attr.kind != FileKind::Dir {
                    continue;
                }
                let attr = self.vfs.remember_listed(&e).await;
                let dir = self.held(nasd_fs::Entry { attr, ..e });
                // Another user's upload cannot be read: it is not listed.
                let Ok(value) = self.vfs.getxattr(cx, dir.ino(), META_XATTR).await else { continue };
                let Ok(meta) = serde_json::from_slice::<UploadMeta>(&value) else { continue };
                if meta.key.starts_with(&prefix) {
                    found.push((meta.key, dir.entry.attr.ctime_ns, id));
                }
            }
        }
        found.sort();
        let key_marker = input.key_marker.clone().unwrap_or_default();
        let after_marker = |key: &str, id: &str| match &input.upload_id_marker {
            Some(id_marker) if !key_marker.is_empty() => {
                key > key_marker.as_str() || (key == key_marker && id > id_marker.as_str())
            }
            _ => key > key_marker.as_str(),
        };
        let delimiter = input.delimiter.clone().filter(|d| !d.is_empty());
        let (mut uploads, mut prefixes, mut truncated) = (Vec::new(), Vec::<String>::new(), false);
        let mut last = None;
        for (key, initiated, id) in found.into_iter().filter(|(k, _, id)| after_marker(k, id)) {
            let rolled = delimiter.as_deref().and_then(|d| {
                let rest = &key[prefix.len()..];
                rest.find(d).map(|at| format!("{prefix}{}", &rest[..at + d.len()]))
            });
            if rolled.is_some() && prefixes.last() == rolled.as_ref() {
                continue;
            }
            if uploads.len() + prefixes.len() == max as usize {
                truncated = true;
                break;
            }
            last = Some((key.clone(), id.clone()));
            match rolled {
                Some(p) => prefixes.push(p),
                None => uploads.push(MultipartUpload {
                    key: Some(key),
                    upload_id: Some(id),
                    initiated: Some(timestamp(initiated)),
                    ..MultipartUpload::default()
                }),
            }
        }
        let (next_key, next_id) = match last.filter(|_| truncated) {
            Some((k, id)) => (Some(k), Some(id)),
            None => (None, None),
        };
        Ok(ListMultipartUploadsOutput {
            bucket: Some(input.bucket),
            prefix: input.prefix,
            delimiter: input.delimiter,
            key_marker: input.key_marker,
            upload_id_marker: input.upload_id_marker,
            next_key_marker: next_key,
            next_upload_id_marker: next_id,
            max_uploads: Some(max),
            is_truncated: Some(truncated),
            uploads: Some(uploads),
            common_prefixes: Some(prefixes.into_iter().map(|p| CommonPrefix { prefix: Some(p) }).collect::<Vec<_>>())
                .filter(|p| !p.is_empty()),
            encoding_type: input.encoding_type,
            ..ListMultipartUploadsOutput::default()
        })
    }

    /// CompleteMultipartUpload: the object's metadata (ETag, checksum).
    pub(crate) async fn mp_complete(&self, cx: &FsClient, input: CompleteMultipartUploadInput) -> S3Result<ObjectMeta> {
        let levels = object_path(&input.key)?;
        check_upload_id(&input.upload_id)?;
        // No part is written while the upload is published.
        let _alone = self.upload_locks.alone(&input.upload_id).await;
        let (upload, meta) = match self.upload(cx, &input.bucket, &input.key, &input.upload_id).await {
            Ok(found) => found,
            Err(e) if *e.code() == S3ErrorCode::NoSuchUpload => {
                return self.completed_before(cx, &input.bucket, &input.key, &input.upload_id).await.ok_or(e);
            }
            Err(e) => return Err(e),
        };
        let wanted = input.multipart_upload.and_then(|m| m.parts).unwrap_or_default();
        if wanted.is_empty() || wanted.len() > PARTS_MAX as usize {
            return Err(s3_error!(MalformedXML, "a completion names 1 to 10000 parts"));
        }
        let mut parts = Vec::with_capacity(wanted.len());
        let mut checksums = Vec::with_capacity(wanted.len());
        let mut digests = Md5::new();
        let (mut last, mut total) = (0, 0u64);
        for (i, p) in wanted.iter().enumerate() {
            let n = p.part_number.ok_or_else(|| s3_error!(InvalidPart))?;
            if n <= last {
                return Err(s3_error!(InvalidPartOrder));
            }
            last = n;
            let found = self.found_part(cx, &upload, n).await?.ok_or_else(|| s3_error!(InvalidPart))?;
            let stored = &found.meta.object;
            let given = p.e_tag.as_ref().map(|t| t.value().to_string());
            if given.as_deref() != Some(stored.etag.as_str()) {
                return Err(s3_error!(InvalidPart, "a part's ETag does not match"));
            }
            check_part_checksum(p, stored.checksum.as_ref())?;
            let size = found.size();
            if i + 1 < wanted.len() && size < self.part_bytes_min {
                return Err(S3Error::with_message(
                    S3ErrorCode::EntityTooSmall,
                    format!(
                        "part {n} is {size} bytes; every part but the last must be at least {}",
                        self.part_bytes_min
                    ),
                ));
            }
            total = total.saturating_add(size);
            if total > MULTIPART_OBJECT_BYTES_MAX {
                return Err(s3_error!(EntityTooLarge, "a multipart object is at most 5 TiB"));
            }
            digests.update(hex::decode(&stored.etag).map_err(|_| s3_error!(InvalidPart))?);
            checksums.push(stored.checksum.clone());
            parts.push(found);
        }
        let etag = format!("{}-{}", hex::encode(digests.finalize()), parts.len());
        let checksum = StoredChecksum::composite(&checksums);
        let upload_id = Some(input.upload_id.clone());
        let object =
            ObjectMeta { etag, content_type: meta.content_type, metadata: meta.metadata, checksum, upload: upload_id };
        // Published in place: parts 1..=k in place, perhaps a last part of its own, and no region
        // past them claimed (checked after marking the upload completing: see `claim_region`).
        let run = in_place_run(&parts);
        let tail_apart = parts.get(run).is_none_or(|tail| tail.meta.in_place.is_none());
        let mut in_place = run > 0 && run + 1 >= parts.len() && tail_apart;
        if in_place {
            self.mark_completing(cx, &upload).await?;
            in_place = !self.claimed_past(cx, &upload, run).await?;
        }
        let stored = if in_place {
            let target = Target { bucket: &input.bucket, levels: &levels, upload: &upload };
            self.publish_in_place(cx, target, parts, run, total, object).await?
        } else {
            self.publish_copy(cx, &input.bucket, &levels, &upload, parts, object).await?
        };
        self.remove_upload(cx, &input.bucket, &input.upload_id, upload).await;
        Ok(stored)
    }

    /// The object a completion of upload `id` made at `key` before, if it
    /// is still there: a completion retried (its answer lost, its client
    /// timed out) answers as the first did.
    async fn completed_before(&self, cx: &FsClient, bucket: &str, key: &str, id: &str) -> Option<ObjectMeta> {
        let (_, meta) = self.object(cx, bucket, key).await.ok()?;
        meta.filter(|m| m.upload.as_deref() == Some(id))
    }

    /// Publishes the upload's staging file as the object: `parts[..in_place]`
    /// lie in it already, a last part of its own is copied after them.
    async fn publish_in_place(
        &self,
        cx: &FsClient,
        target: Target<'_>,
        mut parts: Vec<FoundPart>,
        in_place: usize,
        total: u64,
        object: ObjectMeta,
    ) -> S3Result<ObjectMeta> {
        let Target { bucket, levels, upload } = target;
        let (name, dirs) = levels.split_last().ok_or_else(|| s3_error!(InvalidArgument))?;
        check_metadata(&object)?;
        let data = match self.vfs.lookup(cx, upload.ino(), DATA_NAME).await {
            Ok(e) => self.held(e),
            Err(e) if is(&e, FsStatus::NotFound) => return Err(s3_error!(InvalidPart)),
            Err(e) => return Err(s3_err(e)),
        };
        let opened = self.vfs.open(cx, data.ino(), true).await.map_err(s3_err)?;
        let fh = OpenFh::new(&self.vfs, opened.fh);
        let tail = parts.split_off(in_place).pop();
        let finished = self.finish_data(cx, &data, fh.fh(), tail, total, &object).await;
        let released = fh.release().await;
        finished?;
        released.map_err(s3_err)?;
        let b = self.bucket(cx, bucket).await?;
        let dir = self.walk(cx, b, dirs, true).await?;
        self.vfs.rename(cx, (upload.ino(), DATA_NAME), (dir.ino(), name)).await.map_err(s3_err)?;
        Ok(object)
    }

    /// Makes the staging file `data` (open as `fh`) the object: `tail`'s
    /// bytes copied to its end (`total`), cut to `total`, `object` its
    /// metadata, committed. Changes no part: a region past the parts in
    /// place is claimed by none (`claimed_past`).
    async fn finish_data(
        &self,
        cx: &FsClient,
        data: &Held,
        fh: u64,
        tail: Option<FoundPart>,
        total: u64,
        object: &ObjectMeta,
    ) -> S3Result<()> {
        if let Some(tail) = tail {
            let size = tail.size();
            let at = total - size;
            let body = self.read_stream(cx, tail.file, 0..size).await?;
            let (_, copied) = self.fill(fh, at..total, crate::IO_CHUNK, body, None).await?;
            if copied != size {
                return Err(s3_error!(InternalError, "the last part ended early"));
            }
        }
        self.vfs.commit(fh).await.map_err(s3_err)?;
        let attr = self.vfs.getattr(cx, data.ino()).await.map_err(s3_err)?;
        if attr.size != total {
            let cut = nasd_fs::SetAttr { size: Some(total), ..nasd_fs::SetAttr::default() };
            self.vfs.setattr(cx, data.ino(), cut).await.map_err(s3_err)?;
        }
        let value = serde_json::to_vec(object).map_err(|_| s3_error!(InternalError))?;
        self.vfs.setxattr(cx, data.ino(), META_XATTR, &value, XattrMode::Either).await.map_err(s3_err)?;
        self.vfs.commit(fh).await.map_err(s3_err)
    }

    /// Streams `parts`, in order, into the object as a PUT writes one.
    async fn publish_copy(
        &self,
        cx: &FsClient,
        bucket: &str,
        levels: &[&str],
        upload: &Held,
        parts: Vec<FoundPart>,
        object: ObjectMeta,
    ) -> S3Result<ObjectMeta> {
        let upload_ino = upload.ino();
        let (me, cx2) = (self.clone(), cx.clone());
        // One part read at a time: memory stays that of one GET.
        let body = futures::stream::iter(parts)
            .then(move |part| {
                let (me, cx) = (me.clone(), cx2.clone());
                async move {
                    let size = part.size();
                    match part.meta.in_place {
                        None => me.read_stream(&cx, part.file, 0..size).await,
                        Some(Placement { offset, size }) => {
                            let data = me.vfs.lookup(&cx, upload_ino, DATA_NAME).await.map_err(s3_err)?;
                            me.read_stream(&cx, me.held(data), offset..offset + size).await
                        }
                    }
                }
            })
            .map_err(|e| std::io::Error::other(e.to_string()))
            .map_ok(|blob| blob.map_err(|e| std::io::Error::other(e.to_string())))
            .try_flatten();
        self.write_levels(cx, bucket, levels, Box::pin(body), object, Expected::nothing(), false)
            .await?
            .ok_or_else(|| s3_error!(InternalError))
    }

    /// AbortMultipartUpload (after the parts being written).
    pub(crate) async fn mp_abort(&self, cx: &FsClient, input: AbortMultipartUploadInput) -> S3Result<()> {
        check_upload_id(&input.upload_id)?;
        let _alone = self.upload_locks.alone(&input.upload_id).await;
        let (upload, _) = self.upload(cx, &input.bucket, &input.key, &input.upload_id).await?;
        self.remove_upload(cx, &input.bucket, &input.upload_id, upload).await;
        Ok(())
    }

    /// ListParts.
    pub(crate) async fn mp_list_parts(&self, cx: &FsClient, input: ListPartsInput) -> S3Result<ListPartsOutput> {
        let (upload, _) = self.upload(cx, &input.bucket, &input.key, &input.upload_id).await?;
        let after = input.part_number_marker.unwrap_or(0);
        let max = input.max_parts.unwrap_or(1000).clamp(0, 1000);
        let mut numbered: Vec<(i32, nasd_fs::Entry)> = self
            .entries(cx, upload.ino())
            .await?
            .into_iter()
            .filter_map(|(name, e)| Some((name.strip_prefix("part-")?.parse::<i32>().ok()?, e)))
            .filter(|(n, e)| *n > after && e.attr.kind == FileKind::File)
            .collect();
        numbered.sort_by_key(|(n, _)| *n);
        let truncated = numbered.len() > max as usize;
        numbered.truncate(max as usize);
        let mut parts = Vec::with_capacity(numbered.len());
        for (n, e) in numbered {
            let attr = self.vfs.remember_listed(&e).await;
            let file = self.held(nasd_fs::Entry { attr, ..e });
            let Some(found) = self.found_part(cx, &upload, n).await? else { continue };
            let (size, meta) = (found.size(), found.meta.object);
            let part = s3s::dto::Part {
                part_number: Some(n),
                size: Some(i64::try_from(size).unwrap_or(i64::MAX)),
                last_modified: Some(timestamp(file.entry.attr.mtime_ns)),
                e_tag: Some(ETag::Strong(meta.etag)),
                ..s3s::dto::Part::default()
            };
            parts.push(with_checksum!(part, meta.checksum.as_ref()));
        }
        let next = if truncated { parts.last().and_then(|p| p.part_number) } else { None };
        Ok(ListPartsOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            part_number_marker: input.part_number_marker,
            next_part_number_marker: next,
            max_parts: Some(max),
            is_truncated: Some(truncated),
            parts: Some(parts),
            ..ListPartsOutput::default()
        })
    }

    /// One sweep for abandoned uploads: removes every multipart upload, in
    /// every bucket, whose directory has not changed (no part added) for
    /// `older_than`, acting as the bucket's and then the upload's owner (an
    /// owner outside the gateway's grant is skipped). How many it removed.
    pub async fn expire_uploads(&self, older_than: std::time::Duration) -> usize {
        let own = self.vfs.fs().clone();
        let now_ns = i64::try_from(nasd_env::clock::system_ns()).unwrap_or(i64::MAX);
        let cutoff = now_ns.saturating_sub(i64::try_from(older_than.as_nanos()).unwrap_or(i64::MAX));
        let mut removed = 0;
        for (bucket, id, upload) in self.all_uploads().await {
            if upload.attr.mtime_ns > cutoff {
                continue;
            }
            let Some(ucx) = self.acting_as(&own, upload.attr.uid, upload.attr.gid) else { continue };
            let attr = self.vfs.remember_listed(&upload).await;
            let held = self.held(nasd_fs::Entry { attr, ..upload });
            let _alone = self.upload_locks.alone(&id).await;
            tracing::info!(%bucket, upload = %id, "removing an abandoned multipart upload");
            self.remove_upload(&ucx, &bucket, &id, held).await;
            removed += 1;
        }
        removed
    }

    /// Every multipart upload in every bucket, listed as the bucket's owner
    /// (an owner outside the gateway's grant is skipped): bucket, id, the
    /// upload's directory (not held).
    async fn all_uploads(&self) -> Vec<(String, String, nasd_fs::Entry)> {
        let own = self.vfs.fs().clone();
        let Ok(buckets) = self.entries(&own, nasd_fs::ROOT_INO).await else { return Vec::new() };
        let mut found = Vec::new();
        for (name, bucket) in buckets.into_iter().filter(|(_, e)| e.attr.kind == FileKind::Dir) {
            let Some(cx) = self.acting_as(&own, bucket.attr.uid, bucket.attr.gid) else { continue };
            let Ok(b) = self.bucket(&cx, &name).await else { continue };
            let Ok(uploads) = self.walk(&cx, b, &[UPLOADS_DIR], false).await else { continue };
            let Ok(listed) = self.entries(&cx, uploads.ino()).await else { continue };
            let uploads =
                listed.into_iter().filter(|(id, e)| check_upload_id(id).is_ok() && e.attr.kind == FileKind::Dir);
            found.extend(uploads.map(|(id, e)| (name.clone(), id, e)));
        }
        found
    }

    /// Counts the open uploads of every user once (`limits::OpenUploads`).
    async fn count_open_uploads(&self) {
        let counted = self.open_uploads.counted.get_or_init(|| async {
            let uploads = self.all_uploads().await;
            for (_, _, upload) in &uploads {
                self.open_uploads.found(upload.attr.uid);
            }
            tracing::info!(uploads = uploads.len(), "counted the open multipart uploads");
        });
        counted.await;
    }

    /// The gateway's client acting as `uid` (itself for its own uid); `None`
    /// if its grant does not cover the ids.
    fn acting_as(&self, own: &FsClient, uid: u32, gid: u32) -> Option<FsClient> {
        if uid == own.identity().uid {
            return Some(own.clone());
        }
        own.as_user(uid, gid, &[]).ok()
    }

    /// Every entry of directory `ino` (held), with attributes.
    async fn entries(&self, cx: &FsClient, ino: nasd_fs::Ino) -> S3Result<Vec<(String, nasd_fs::Entry)>> {
        let fh = self.vfs.opendir(ino).map_err(s3_err)?;
        let mut items = Vec::new();
        let r = self
            .vfs
            .readdir(cx, fh, nasd_vfs::FIRST_ENTRY, |_, item| {
                items.push(item.clone());
                false
            })
            .await;
        self.vfs.releasedir(fh);
        r.map_err(s3_err)?;
        Ok(items.into_iter().filter_map(|i| Some((i.name, i.entry?))).collect())
    }

    /// Removes an upload's parts (and any temporary names) and its directory,
    /// best effort: what is left is the caller's to abort again.
    async fn remove_upload(&self, cx: &FsClient, bucket: &str, id: &str, upload: Held) {
        if let Ok(entries) = self.entries(cx, upload.ino()).await {
            for (name, e) in entries {
                let removed = if e.attr.kind == FileKind::Dir {
                    self.vfs.rmdir(cx, upload.ino(), &name).await
                } else {
                    self.vfs.unlink(cx, upload.ino(), &name).await
                };
                if let Err(e) = removed {
                    tracing::warn!(error = %e, "removing a part of a finished upload failed");
                }
            }
        }
        let owner = upload.entry.attr.uid;
        drop(upload);
        let Ok(b) = self.bucket(cx, bucket).await else { return };
        let Ok(uploads) = self.walk(cx, b, &[UPLOADS_DIR], false).await else { return };
        match self.vfs.rmdir(cx, uploads.ino(), id).await {
            Ok(()) => self.open_uploads.closed(owner),
            Err(e) => tracing::warn!(error = %e, "removing a finished upload's directory failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_in_place_are_buffered_in_whole_stripes_within_the_bound() {
        let mib = 1u64 << 20;
        assert_eq!(in_place_piece_bytes(4 * mib), 4 << 20, "rs:4+2 at 1 MiB units: one stripe");
        assert_eq!(in_place_piece_bytes(8 * mib), 8 << 20, "at the bound: one stripe");
        assert_eq!(in_place_piece_bytes(3 * 256 * 1024), 3 * 256 * 1024, "a multiple of a small stripe");
        assert_eq!(in_place_piece_bytes(192 * 1024) % (192 * 1024), 0, "whole small stripes");
        assert!(in_place_piece_bytes(192 * 1024) <= crate::IO_CHUNK);
        assert_eq!(in_place_piece_bytes(12 * mib), crate::IO_CHUNK, "past the bound: IO_CHUNK pieces");
        assert_eq!(in_place_piece_bytes(0), crate::IO_CHUNK);
    }

    #[test]
    fn a_part_record_keeps_its_place_beside_an_objects_metadata() {
        let meta = PartMeta {
            object: ObjectMeta { etag: "ab".into(), ..ObjectMeta::default() },
            in_place: Some(Placement { offset: 8, size: 4 }),
        };
        let json = serde_json::to_vec(&meta).unwrap();
        let back: PartMeta = serde_json::from_slice(&json).unwrap();
        assert_eq!((back.object.etag.as_str(), back.in_place), ("ab", Some(Placement { offset: 8, size: 4 })));
        let as_object: ObjectMeta = serde_json::from_slice(&json).unwrap();
        assert_eq!(as_object.etag, "ab", "read as an object's metadata, a record is its ETag");
        let own_file: PartMeta = serde_json::from_slice(br#"{"etag":"cd"}"#).unwrap();
        assert_eq!(own_file.in_place, None, "a part of its own (as before) has no place");
    }
}
