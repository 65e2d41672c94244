"""Checksums through the nasd S3 gateway with boto3: x-amz-checksum-* and
Content-MD5 verified on PutObject and UploadPart (a wrong one is BadDigest
and stores nothing, a malformed one InvalidDigest/InvalidRequest), kept and
returned on GET and HEAD with ChecksumMode, a multipart object's composite
checksum (checksum of the parts' checksums, -N), a completion naming a
part's checksum wrongly refused. Usage: checksum_check.py ENDPOINT BUCKET
(keys from the environment). Prints "checksums ok" at the end."""
import base64
import hashlib
import sys
import zlib

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint, bucket = sys.argv[1], sys.argv[2]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


def b64(raw):
    return base64.b64encode(raw).decode()


def crc32(data):
    return b64(zlib.crc32(data).to_bytes(4, "big"))


def sha256(data):
    return b64(hashlib.sha256(data).digest())


def refused(code, call, **kw):
    try:
        call(**kw)
    except ClientError as e:
        assert e.response["Error"]["Code"] == code, (code, e.response)
        return
    raise AssertionError("%s was taken: %r" % (call.__name__, {k: v for k, v in kw.items() if k != "Body"}))


def absent(key):
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 404, e.response
        return
    raise AssertionError("%s was stored" % key)


body = bytes(range(256)) * 300
# boto3 computes SHA-256 and sends it; the gateway checks it, keeps it, returns it when asked.
r = s3.put_object(Bucket=bucket, Key="ck/sha.bin", Body=body, ChecksumAlgorithm="SHA256")
assert r["ChecksumSHA256"] == sha256(body), r
h = s3.head_object(Bucket=bucket, Key="ck/sha.bin", ChecksumMode="ENABLED")
assert h["ChecksumSHA256"] == sha256(body), h
assert "ChecksumSHA256" not in s3.head_object(Bucket=bucket, Key="ck/sha.bin"), "only when asked"
g = s3.get_object(Bucket=bucket, Key="ck/sha.bin", ChecksumMode="ENABLED")
assert g["ChecksumSHA256"] == sha256(body) and g["Body"].read() == body, g
g = s3.get_object(Bucket=bucket, Key="ck/sha.bin", ChecksumMode="ENABLED", Range="bytes=0-9")
assert "ChecksumSHA256" not in g and g["Body"].read() == body[:10], "a range has no whole-object checksum"
# A value given by the caller is sent as it is: right, it is kept; wrong, BadDigest and nothing stored.
r = s3.put_object(Bucket=bucket, Key="ck/crc.bin", Body=body, ChecksumCRC32=crc32(body))
assert r["ChecksumCRC32"] == crc32(body), r
refused("BadDigest", s3.put_object, Bucket=bucket, Key="ck/bad-crc.bin", Body=body, ChecksumCRC32=crc32(body[1:]))
absent("ck/bad-crc.bin")
refused("BadDigest", s3.put_object, Bucket=bucket, Key="ck/sha.bin", Body=b"replaced?", ChecksumSHA256=sha256(body))
assert s3.get_object(Bucket=bucket, Key="ck/sha.bin")["Body"].read() == body, "a refused PUT replaced nothing"
md5 = b64(hashlib.md5(body).digest())
s3.put_object(Bucket=bucket, Key="ck/md5.bin", Body=body, ContentMD5=md5)
refused("BadDigest", s3.put_object, Bucket=bucket, Key="ck/bad-md5.bin", Body=body + b"!", ContentMD5=md5)
refused("InvalidDigest", s3.put_object, Bucket=bucket, Key="ck/bad-md5.bin", Body=body, ContentMD5="not-an-md5")
refused("InvalidRequest", s3.put_object, Bucket=bucket, Key="ck/bad-md5.bin", Body=body, ChecksumCRC32="AAAA")
absent("ck/bad-md5.bin")

# Multipart with SHA-256: each part checked; the object's checksum is S3's composite.
key = "ck/mp.bin"
u = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256")["UploadId"]
p1, p2 = b"x" * (5 << 20), b"tail" * 1000
refused("BadDigest", s3.upload_part, Bucket=bucket, Key=key, UploadId=u, PartNumber=1, Body=p1,
        ChecksumSHA256=sha256(p2))
assert "Parts" not in s3.list_parts(Bucket=bucket, Key=key, UploadId=u) or \
    not s3.list_parts(Bucket=bucket, Key=key, UploadId=u)["Parts"], "a refused part was kept"
r1 = s3.upload_part(Bucket=bucket, Key=key, UploadId=u, PartNumber=1, Body=p1, ChecksumAlgorithm="SHA256")
r2 = s3.upload_part(Bucket=bucket, Key=key, UploadId=u, PartNumber=2, Body=p2, ChecksumAlgorithm="SHA256")
assert (r1["ChecksumSHA256"], r2["ChecksumSHA256"]) == (sha256(p1), sha256(p2)), (r1, r2)
listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=u)["Parts"]
assert [p["ChecksumSHA256"] for p in listed] == [sha256(p1), sha256(p2)], listed
parts = [{"PartNumber": 1, "ETag": r1["ETag"], "ChecksumSHA256": sha256(p1)},
         {"PartNumber": 2, "ETag": r2["ETag"], "ChecksumSHA256": sha256(p1)}]
refused("InvalidPart", s3.complete_multipart_upload, Bucket=bucket, Key=key, UploadId=u,
        MultipartUpload={"Parts": parts})
parts[1]["ChecksumSHA256"] = sha256(p2)
done = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=u, MultipartUpload={"Parts": parts})
composite = b64(hashlib.sha256(hashlib.sha256(p1).digest() + hashlib.sha256(p2).digest()).digest()) + "-2"
assert done["ChecksumSHA256"] == composite, done
h = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
assert h["ChecksumSHA256"] == composite and h["ContentLength"] == len(p1) + len(p2), h
assert s3.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")["Body"].read() == p1 + p2
print("checksums ok")
