"""Multipart uploads through the nasd S3 gateway, parts written in place:
parts out of order, a part sent again (the last one wins), parts of
different sizes, gaps in the numbers, a completion naming fewer parts than
were sent, UploadPartCopy, abort, and a completion replacing an object.
Every object read back whole, with S3's MD5-of-MD5s-N ETag. The order the
parts go in comes from SEED (printed). Usage: multipart_check.py ENDPOINT
BUCKET PART_BYTES SEED (keys from the environment; PART_BYTES the gateway's
part minimum). Prints "multipart ok" at the end."""
import hashlib
import random
import sys

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint, bucket, part_bytes, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
print("seed", seed)
rng = random.Random(seed)
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


def data(n):
    return rng.randbytes(n)


def etag_of(parts):
    digests = b"".join(hashlib.md5(p).digest() for p in parts)
    return '"%s-%d"' % (hashlib.md5(digests).hexdigest(), len(parts))


def upload(key, sends, named=None):
    """Sends `sends` ([(number, bytes)], in that order) to a new upload of
    `key`, completes it with the parts `named` (numbers; default all, last
    sent wins) and checks the object: the named parts' bytes, in order."""
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    latest = {}
    for number, body in sends:
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=number, Body=body)
        assert r["ETag"] == '"%s"' % hashlib.md5(body).hexdigest(), (key, number, r["ETag"])
        latest[number] = (body, r["ETag"])
    named = sorted(latest) if named is None else named
    listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed] == \
        [(n, len(latest[n][0]), latest[n][1]) for n in sorted(latest)], (key, listed)
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": latest[n][1]} for n in named]})
    bodies = [latest[n][0] for n in named]
    assert done["ETag"] == etag_of(bodies), (key, done["ETag"])
    got = s3.get_object(Bucket=bucket, Key=key)
    whole = b"".join(bodies)
    back = got["Body"].read()
    assert back == whole, (key, len(back), len(whole))
    assert got["ETag"] == etag_of(bodies), (key, got["ETag"])
    gone = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert all(u["UploadId"] != uid for u in gone), (key, gone)
    return uid


def shuffled(sends):
    sends = list(sends)
    rng.shuffle(sends)
    return sends


P = part_bytes
# In order, a short last part (copied after the parts in place).
upload("in-order.bin", [(1, data(P)), (2, data(P)), (3, data(P)), (4, data(1000))])
# Every part of the part size: nothing copied at all.
upload("whole-parts.bin", shuffled([(n, data(P)) for n in range(1, 5)]))
# Out of order, the short last part first (it fixes no part size).
upload("out-of-order.bin", [(4, data(777))] + shuffled([(n, data(P)) for n in range(1, 4)]))
# A part sent again, of the part size and of another: the last one wins.
upload("again.bin", shuffled([(1, data(P)), (2, data(P)), (3, data(10))])
       + [(2, data(P)), (3, data(20)), (1, data(P))])
upload("again-other-size.bin", [(1, data(P)), (2, data(P)), (2, data(P + 4096)), (3, data(5))])
# Parts of different sizes (an unequal client): copied, whole.
upload("unequal.bin", shuffled([(1, data(P)), (2, data(2 * P)), (3, data(P + 1)), (4, data(P)), (5, data(3))]))
# Gaps in the numbers.
upload("gaps.bin", shuffled([(1, data(P)), (2, data(P)), (4, data(P)), (7, data(100))]))
# A completion naming fewer parts than were sent: the others are discarded.
upload("fewer.bin", shuffled([(1, data(P)), (2, data(P)), (3, data(P)), (4, data(P))]), named=[1, 2])
upload("fewer-gap.bin", shuffled([(1, data(P)), (2, data(P)), (3, data(P)), (4, data(9))]), named=[1, 2, 4])
# A completion replacing an object made by one.
upload("in-order.bin", shuffled([(1, data(P)), (2, data(P)), (3, data(P))]))

# A completion with a stale ETag (a part sent again) is refused and changes nothing.
key = "stale.bin"
uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
first = data(P)
old = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=1, Body=first)["ETag"]
second = data(P)
new = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=1, Body=second)["ETag"]
try:
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": old}]})
    raise AssertionError("a stale ETag completed")
except ClientError as e:
    assert e.response["Error"]["Code"] == "InvalidPart", e.response
try:
    s3.head_object(Bucket=bucket, Key=key)
    raise AssertionError("a refused completion made the object")
except ClientError as e:
    assert e.response["Error"]["Code"] in ("404", "NoSuchKey"), e.response
s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid,
                             MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": new}]})
assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == second

# UploadPartCopy, in place: ranges of an object as parts.
source = data(3 * P)
s3.put_object(Bucket=bucket, Key="copy-source.bin", Body=source)
key = "copied.bin"
uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
parts = []
for n, (a, b) in enumerate([(P, 2 * P), (0, P), (2 * P, 3 * P - 1)], start=1):
    r = s3.upload_part_copy(Bucket=bucket, Key=key, UploadId=uid, PartNumber=n,
                            CopySource={"Bucket": bucket, "Key": "copy-source.bin"},
                            CopySourceRange="bytes=%d-%d" % (a, b - 1))
    parts.append({"PartNumber": n, "ETag": r["CopyPartResult"]["ETag"]})
s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": parts})
want = source[P:2 * P] + source[0:P] + source[2 * P:3 * P - 1]
assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == want

# Abort: the upload and its parts go; the key never appears.
key = "aborted.bin"
uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
for n in shuffled(range(1, 4)):
    s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=n, Body=data(P))
s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=uid)
try:
    s3.list_parts(Bucket=bucket, Key=key, UploadId=uid)
    raise AssertionError("an aborted upload is listed")
except ClientError as e:
    assert e.response["Error"]["Code"] == "NoSuchUpload", e.response
try:
    s3.head_object(Bucket=bucket, Key=key)
    raise AssertionError("an aborted upload made the object")
except ClientError as e:
    assert e.response["Error"]["Code"] in ("404", "NoSuchKey"), e.response
assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads"), "uploads left"
print("multipart ok")
