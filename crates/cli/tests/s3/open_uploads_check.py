"""Open multipart uploads bounded per user through the nasd S3 gateway.
Usage: open_uploads_check.py ENDPOINT BUCKET N fill|full (keys from the
environment; N the gateway's [s3] open_uploads_per_user).
fill: opens N uploads (none before); one more is refused with
TooManyOpenMultipartUploads; aborting one, and completing one, each make
room for one more; leaves N open.
full: (N open already, e.g. a restarted gateway) one more is refused; after
aborting them all, uploads open again, and the bucket has none left.
Prints "open uploads ok" at the end."""
import sys

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint, bucket, n, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


def create(key):
    return s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]


def refused(key):
    try:
        uid = create(key)
    except ClientError as e:
        assert e.response["Error"]["Code"] == "TooManyOpenMultipartUploads", e.response
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 400, e.response
        return
    raise AssertionError("upload %s opened past the bound of %d" % (uid, n))


def listed():
    return s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])


if mode == "fill":
    assert not listed(), listed()
    opened = [("k%d" % i, create("k%d" % i)) for i in range(n)]
    refused("one-more")
    key, uid = opened.pop()
    s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=uid)
    opened.append(("after-abort", create("after-abort")))
    refused("one-more")
    key, uid = opened.pop(0)
    etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=1, Body=b"done")["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"done"
    opened.append(("after-complete", create("after-complete")))
    refused("one-more")
    assert len(listed()) == n, listed()
elif mode == "full":
    refused("one-more")
    for u in listed():
        s3.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
    assert not listed(), listed()
    uid = create("again")
    s3.abort_multipart_upload(Bucket=bucket, Key="again", UploadId=uid)
    assert not listed(), listed()
else:
    raise SystemExit("mode: fill or full")
print("open uploads ok")
