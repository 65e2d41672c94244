//! Checksums a client sends with a body (PutObject, UploadPart): a
//! `Content-MD5`, and at most one of S3's additional checksums
//! (`x-amz-checksum-crc32`, `-crc32c`, `-crc64nvme`, `-sha1`, `-sha256`)
//! given in a header or announced in `x-amz-trailer` and sent after an
//! `aws-chunked` body (s3s checks the trailer's signature and hands it
//! over once the body is read). `x-amz-sdk-checksum-algorithm` must agree
//! with the checksum sent.
//!
//! The body is hashed as it is written; a mismatch is `BadDigest` and the
//! object (or part) is abandoned before it is published, so nothing is
//! stored. A malformed value is `InvalidDigest` (Content-MD5) or
//! `InvalidRequest` (the others), refused before any byte is written. The
//! additional checksum is kept in the object's metadata and returned on
//! GET and HEAD of the whole object when the client asks
//! (`x-amz-checksum-mode: ENABLED`). A multipart object whose parts all
//! carry the same algorithm keeps S3's composite checksum: the checksum of
//! the parts' raw checksums, `-N`.

use s3s::checksum::ChecksumHasher;
use s3s::dto::Checksum;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Result, TrailingHeaders};
use serde::{Deserialize, Serialize};

/// Size of a `Content-MD5` digest.
const MD5_BYTES: usize = 16;

/// One of S3's additional checksum algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Algorithm {
    Crc32,
    Crc32c,
    Crc64Nvme,
    Sha1,
    Sha256,
}

/// Every algorithm, in the order headers are looked for.
const ALGORITHMS: [Algorithm; 5] =
    [Algorithm::Crc32, Algorithm::Crc32c, Algorithm::Crc64Nvme, Algorithm::Sha1, Algorithm::Sha256];

impl Algorithm {
    /// As S3 names it (`x-amz-sdk-checksum-algorithm`, `ChecksumAlgorithm`).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "CRC32",
            Algorithm::Crc32c => "CRC32C",
            Algorithm::Crc64Nvme => "CRC64NVME",
            Algorithm::Sha1 => "SHA1",
            Algorithm::Sha256 => "SHA256",
        }
    }

    fn from_name(name: &str) -> Option<Algorithm> {
        ALGORITHMS.into_iter().find(|a| a.name().eq_ignore_ascii_case(name))
    }

    /// The header (or trailer) carrying its value.
    pub fn header(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "x-amz-checksum-crc32",
            Algorithm::Crc32c => "x-amz-checksum-crc32c",
            Algorithm::Crc64Nvme => "x-amz-checksum-crc64nvme",
            Algorithm::Sha1 => "x-amz-checksum-sha1",
            Algorithm::Sha256 => "x-amz-checksum-sha256",
        }
    }

    /// Bytes of its digest.
    fn digest_bytes(self) -> usize {
        match self {
            Algorithm::Crc32 | Algorithm::Crc32c => 4,
            Algorithm::Crc64Nvme => 8,
            Algorithm::Sha1 => 20,
            Algorithm::Sha256 => 32,
        }
    }

    /// A hasher computing this algorithm only.
    pub fn hasher(self) -> ChecksumHasher {
        let mut h = ChecksumHasher::default();
        match self {
            Algorithm::Crc32 => h.crc32 = Some(s3s::crypto::Checksum::new()),
            Algorithm::Crc32c => h.crc32c = Some(s3s::crypto::Checksum::new()),
            Algorithm::Crc64Nvme => h.crc64nvme = Some(s3s::crypto::Checksum::new()),
            Algorithm::Sha1 => h.sha1 = Some(s3s::crypto::Checksum::new()),
            Algorithm::Sha256 => h.sha256 = Some(s3s::crypto::Checksum::new()),
        }
        h
    }

    /// Its value (base64) among `c`'s.
    fn pick(self, c: Checksum) -> Option<String> {
        match self {
            Algorithm::Crc32 => c.checksum_crc32,
            Algorithm::Crc32c => c.checksum_crc32c,
            Algorithm::Crc64Nvme => c.checksum_crc64nvme,
            Algorithm::Sha1 => c.checksum_sha1,
            Algorithm::Sha256 => c.checksum_sha256,
        }
    }

    /// `c` with only this algorithm's value, `value`.
    pub fn into_checksum(self, value: String) -> Checksum {
        let mut c = Checksum::default();
        match self {
            Algorithm::Crc32 => c.checksum_crc32 = Some(value),
            Algorithm::Crc32c => c.checksum_crc32c = Some(value),
            Algorithm::Crc64Nvme => c.checksum_crc64nvme = Some(value),
            Algorithm::Sha1 => c.checksum_sha1 = Some(value),
            Algorithm::Sha256 => c.checksum_sha256 = Some(value),
        }
        c
    }
}

/// The additional checksum an object or part keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredChecksum {
    pub algorithm: Algorithm,
    /// Base64 of the digest; a multipart object's ends in `-N`.
    pub value: String,
}

impl StoredChecksum {
    /// True for a multipart object's composite checksum.
    pub fn is_composite(&self) -> bool {
        self.value.contains('-')
    }

    /// The composite checksum of `parts` (in order), if all carry one of
    /// the same algorithm: the checksum of their raw digests, `-N`.
    pub fn composite(parts: &[Option<StoredChecksum>]) -> Option<StoredChecksum> {
        let algorithm = parts.first()?.as_ref()?.algorithm;
        let mut h = algorithm.hasher();
        for part in parts {
            let part = part.as_ref().filter(|p| p.algorithm == algorithm && !p.is_composite())?;
            h.update(&decode(&part.value)?);
        }
        let value = algorithm.pick(h.finalize())?;
        Some(StoredChecksum { algorithm, value: format!("{value}-{}", parts.len()) })
    }
}

fn decode(value: &str) -> Option<Vec<u8>> {
    base64_simd::STANDARD.decode_to_vec(value.trim()).ok()
}

/// What a request's headers say its body must hash to.
#[derive(Debug, Default)]
pub(crate) struct Expected {
    md5: Option<[u8; MD5_BYTES]>,
    algorithm: Option<Algorithm>,
    /// The additional checksum's digest when given in a header.
    given: Option<Vec<u8>>,
    /// Where the additional checksum arrives when announced in `x-amz-trailer`.
    trailer: Option<TrailingHeaders>,
}

fn invalid_request(message: String) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidRequest, message)
}

impl Expected {
    /// Nothing expected (a copy: the gateway reads its own bytes).
    pub fn nothing() -> Expected {
        Expected::default()
    }

    /// What `headers` (and, for a checksum in `x-amz-trailer`, `trailers`)
    /// ask for.
    ///
    /// # Errors
    /// `InvalidDigest` for a malformed Content-MD5, `InvalidRequest` for a
    /// malformed checksum, more than one, or ones that disagree.
    pub fn of_request(headers: &http::HeaderMap, trailers: Option<TrailingHeaders>) -> S3Result<Expected> {
        let mut expected = Expected::default();
        if let Some(v) = headers.get("content-md5") {
            let digest = v.to_str().ok().and_then(decode).and_then(|d| <[u8; MD5_BYTES]>::try_from(d).ok());
            expected.md5 = Some(digest.ok_or_else(|| s3_error!(InvalidDigest, "the Content-MD5 is not an MD5"))?);
        }
        for algorithm in ALGORITHMS {
            let Some(v) = headers.get(algorithm.header()) else { continue };
            if expected.algorithm.is_some() {
                return Err(invalid_request("expecting a single x-amz-checksum- header".into()));
            }
            let digest = v.to_str().ok().and_then(decode).filter(|d| d.len() == algorithm.digest_bytes());
            let invalid = || invalid_request(format!("value for {} header is invalid", algorithm.header()));
            expected.given = Some(digest.ok_or_else(invalid)?);
            expected.algorithm = Some(algorithm);
        }
        if let Some(v) = headers.get("x-amz-trailer") {
            let named = v.to_str().unwrap_or_default().trim();
            let algorithm = ALGORITHMS.into_iter().find(|a| a.header().eq_ignore_ascii_case(named));
            let algorithm = algorithm.ok_or_else(|| invalid_request(format!("unsupported x-amz-trailer {named:?}")))?;
            if expected.algorithm.is_some() {
                return Err(invalid_request("expecting a single x-amz-checksum- header or trailer".into()));
            }
            let trailers =
                trailers.ok_or_else(|| invalid_request("x-amz-trailer without an aws-chunked body".into()))?;
            expected.algorithm = Some(algorithm);
            expected.trailer = Some(trailers);
        }
        if let Some(v) = headers.get("x-amz-sdk-checksum-algorithm") {
            let named = v.to_str().ok().and_then(Algorithm::from_name);
            let named = named.ok_or_else(|| invalid_request("unknown x-amz-sdk-checksum-algorithm".into()))?;
            if expected.algorithm != Some(named) {
                return Err(invalid_request(format!(
                    "x-amz-sdk-checksum-algorithm {} without its {} header or trailer",
                    named.name(),
                    named.header()
                )));
            }
        }
        Ok(expected)
    }

    /// A hasher for the additional checksum, if one is expected.
    pub fn hasher(&self) -> Option<ChecksumHasher> {
        self.algorithm.map(Algorithm::hasher)
    }

    /// Checks a body's MD5 and additional checksum (`computed`, from
    /// [`Expected::hasher`]) against what was sent: the checksum to keep.
    ///
    /// # Errors
    /// `BadDigest` for a mismatch; `InvalidRequest` when a checksum
    /// announced in `x-amz-trailer` did not come.
    pub fn verify(self, md5: &[u8; MD5_BYTES], computed: Option<Checksum>) -> S3Result<Option<StoredChecksum>> {
        if self.md5.is_some_and(|want| &want != md5) {
            return Err(s3_error!(BadDigest, "the Content-MD5 you specified did not match what was received"));
        }
        let Some(algorithm) = self.algorithm else { return Ok(None) };
        let value = computed.and_then(|c| algorithm.pick(c)).ok_or_else(|| s3_error!(InternalError))?;
        let given = match (self.given, self.trailer) {
            (Some(given), _) => given,
            (None, Some(trailer)) => {
                let sent = trailer.take().and_then(|h| Some(h.get(algorithm.header())?.to_str().ok()?.to_string()));
                let digest = sent.as_deref().and_then(decode).filter(|d| d.len() == algorithm.digest_bytes());
                digest.ok_or_else(|| {
                    invalid_request(format!("the {} trailer did not come or is invalid", algorithm.header()))
                })?
            }
            (None, None) => return Err(s3_error!(InternalError)),
        };
        if decode(&value).as_deref() != Some(given.as_slice()) {
            return Err(S3Error::with_message(
                S3ErrorCode::BadDigest,
                format!("the {} you specified did not match the calculated checksum", algorithm.name()),
            ));
        }
        Ok(Some(StoredChecksum { algorithm, value }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use md5::Digest;

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    fn b64(bytes: &[u8]) -> String {
        base64_simd::STANDARD.encode_to_string(bytes)
    }

    /// The body hashed as `fill` hashes it, then verified.
    fn check(pairs: &[(&'static str, &str)], body: &[u8]) -> S3Result<Option<StoredChecksum>> {
        let expected = Expected::of_request(&headers(pairs), None)?;
        let mut hasher = expected.hasher();
        if let Some(h) = hasher.as_mut() {
            h.update(body);
        }
        let md5: [u8; 16] = md5::Md5::digest(body).into();
        expected.verify(&md5, hasher.map(ChecksumHasher::finalize))
    }

    fn code(r: S3Result<Option<StoredChecksum>>) -> String {
        r.expect_err("refused").code().as_str().to_string()
    }

    #[test]
    fn known_answers_pass_and_any_other_value_is_bad_digest() {
        let body = b"hello world";
        // CRC32 (IEEE) and CRC32C (Castagnoli) of "hello world", and its SHA-256.
        let crc32 = b64(&0x0d4a_1185_u32.to_be_bytes());
        let crc32c = b64(&0xc994_65aa_u32.to_be_bytes());
        let sha256 = b64(&hex::decode("b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9").unwrap());
        let md5 = b64(&md5::Md5::digest(body));
        let got = check(&[("x-amz-checksum-crc32", &crc32), ("content-md5", &md5)], body).unwrap();
        assert_eq!(got, Some(StoredChecksum { algorithm: Algorithm::Crc32, value: crc32.clone() }));
        let got = check(&[("x-amz-checksum-crc32c", &crc32c), ("x-amz-sdk-checksum-algorithm", "crc32c")], body);
        assert_eq!(got.unwrap().unwrap().value, crc32c);
        assert_eq!(check(&[("x-amz-checksum-sha256", &sha256)], body).unwrap().unwrap().algorithm, Algorithm::Sha256);
        assert_eq!(check(&[], body).unwrap(), None, "nothing sent, nothing kept");

        assert_eq!(code(check(&[("x-amz-checksum-crc32", &crc32)], b"hello worle")), "BadDigest");
        assert_eq!(code(check(&[("x-amz-checksum-crc32c", &crc32)], body)), "BadDigest");
        assert_eq!(code(check(&[("content-md5", &b64(&[0; 16]))], body)), "BadDigest");
    }

    #[test]
    fn malformed_or_contradictory_headers_are_refused() {
        let crc = b64(&[1, 2, 3, 4]);
        let refused = |pairs: &[(&'static str, &str)]| {
            Expected::of_request(&headers(pairs), None).expect_err("refused").code().as_str().to_string()
        };
        assert_eq!(refused(&[("content-md5", "not base64!")]), "InvalidDigest");
        assert_eq!(refused(&[("content-md5", &b64(&[0; 15]))]), "InvalidDigest");
        assert_eq!(refused(&[("x-amz-checksum-crc32", &b64(&[1, 2, 3]))]), "InvalidRequest");
        assert_eq!(refused(&[("x-amz-checksum-sha1", &crc)]), "InvalidRequest");
        assert_eq!(refused(&[("x-amz-checksum-crc32", &crc), ("x-amz-checksum-crc32c", &crc)]), "InvalidRequest");
        assert_eq!(
            refused(&[("x-amz-checksum-crc32", &crc), ("x-amz-sdk-checksum-algorithm", "SHA1")]),
            "InvalidRequest"
        );
        assert_eq!(refused(&[("x-amz-sdk-checksum-algorithm", "CRC32")]), "InvalidRequest");
        assert_eq!(refused(&[("x-amz-sdk-checksum-algorithm", "ADLER32")]), "InvalidRequest");
        assert_eq!(refused(&[("x-amz-trailer", "x-amz-checksum-crc32")]), "InvalidRequest", "no aws-chunked body");
    }

    #[test]
    fn a_composite_checksum_is_the_checksum_of_the_parts_checksums() {
        let part = |v: &[u8]| Some(StoredChecksum { algorithm: Algorithm::Sha256, value: b64(v) });
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let mut joined = a.to_vec();
        joined.extend_from_slice(&b);
        let want = format!("{}-2", b64(&sha2_of(&joined)));
        let got = StoredChecksum::composite(&[part(&a), part(&b)]).unwrap();
        assert_eq!(got.value, want);
        assert!(got.is_composite());
        assert_eq!(StoredChecksum::composite(&[part(&a), None]), None, "a part without one: none");
        let crc = Some(StoredChecksum { algorithm: Algorithm::Crc32, value: b64(&[0; 4]) });
        assert_eq!(StoredChecksum::composite(&[part(&a), crc]), None, "mixed algorithms: none");
    }

    fn sha2_of(data: &[u8]) -> Vec<u8> {
        let mut h = Algorithm::Sha256.hasher();
        h.update(data);
        decode(&h.finalize().checksum_sha256.unwrap()).unwrap()
    }
}
