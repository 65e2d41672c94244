"""The nasd S3 gateway over HTTPS with boto3 (the CA from AWS_CA_BUNDLE):
PutObject and UploadPart with a CRC32 checksum, which botocore sends over
HTTPS as an aws-chunked body with the checksum in a trailer
(x-amz-trailer), verified and kept: returned on PUT, on GET and HEAD with
ChecksumMode, and a multipart object's composite checksum. Usage:
tls_check.py ENDPOINT BUCKET (keys from the environment). Prints "tls ok"
at the end."""
import base64
import sys
import zlib

import boto3
from botocore.config import Config

endpoint, bucket = sys.argv[1], sys.argv[2]
assert endpoint.startswith("https://"), endpoint
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
sent = []
s3.meta.events.register("before-send.s3.*", lambda request, **_: sent.append(dict(request.headers)))


def crc32(data):
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def trailer_sent():
    """The last request carried its checksum in a trailer."""
    headers = {k.lower(): (v.decode() if isinstance(v, bytes) else v) for k, v in sent[-1].items()}
    return headers.get("x-amz-trailer", "").lower() == "x-amz-checksum-crc32" \
        and "aws-chunked" in headers.get("content-encoding", "")


body = bytes(range(256)) * 3000
r = s3.put_object(Bucket=bucket, Key="trailer.bin", Body=body, ChecksumAlgorithm="CRC32")
assert trailer_sent(), sent[-1]
assert r["ChecksumCRC32"] == crc32(body), r
got = s3.get_object(Bucket=bucket, Key="trailer.bin", ChecksumMode="ENABLED")
assert got["Body"].read() == body
assert got["ChecksumCRC32"] == crc32(body), got
head = s3.head_object(Bucket=bucket, Key="trailer.bin", ChecksumMode="ENABLED")
assert head["ChecksumCRC32"] == crc32(body), head

# Multipart, each part's checksum in its trailer; the composite checksum of the parts' checksums.
key = "trailer-parts.bin"
uid = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32")["UploadId"]
parts, bodies = [], [bytes([n]) * (5 << 20) for n in (1, 2)] + [b"tail"]
for n, part in enumerate(bodies, start=1):
    r = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=n, Body=part, ChecksumAlgorithm="CRC32")
    assert trailer_sent(), sent[-1]
    assert r["ChecksumCRC32"] == crc32(part), r
    parts.append({"PartNumber": n, "ETag": r["ETag"], "ChecksumCRC32": r["ChecksumCRC32"]})
done = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": parts})
composite = base64.b64encode(zlib.crc32(b"".join(base64.b64decode(p["ChecksumCRC32"]) for p in parts))
                             .to_bytes(4, "big")).decode()
assert done["ChecksumCRC32"] == "%s-3" % composite, done
assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"".join(bodies)
print("tls ok")
