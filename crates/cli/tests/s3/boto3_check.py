"""boto3 against the nasd S3 gateway: metadata and Content-Type kept, ETag is
the MD5 of the body, ranges, ListObjectsV2 with delimiter and pagination in
byte order, ListObjects v1, CopyObject, DeleteObjects, keys that cannot be
paths refused. Usage: boto3_check.py ENDPOINT BUCKET (keys from the
environment). Prints "boto3 ok" at the end; any failure raises."""
import base64
import hashlib
import sys
import urllib.error
import urllib.request

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint, bucket = sys.argv[1], sys.argv[2]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))

body = bytes(range(256)) * 40
r = s3.put_object(Bucket=bucket, Key="m/obj.bin", Body=body, ContentType="application/x-test",
                  Metadata={"colour": "blue", "n": "7"})
assert r["ETag"] == '"%s"' % hashlib.md5(body).hexdigest(), r["ETag"]
h = s3.head_object(Bucket=bucket, Key="m/obj.bin")
assert h["ContentLength"] == len(body), h
assert h["ContentType"] == "application/x-test", h
assert h["Metadata"] == {"colour": "blue", "n": "7"}, h["Metadata"]
g = s3.get_object(Bucket=bucket, Key="m/obj.bin", Range="bytes=-10")
assert g["Body"].read() == body[-10:]
assert g["ContentRange"] == "bytes %d-%d/%d" % (len(body) - 10, len(body) - 1, len(body)), g["ContentRange"]

# Conditional GET: the current ETag is not modified.
try:
    s3.get_object(Bucket=bucket, Key="m/obj.bin", IfNoneMatch=r["ETag"])
    raise AssertionError("If-None-Match with the current ETag returned the body")
except ClientError as e:
    assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 304, e.response

# Keys in S3's byte order, though they are a tree: "a-b" < "a/x" < "a0".
for k in ["l/a/x", "l/a-b", "l/a0", "l/a/y/z", "l/b"]:
    s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
keys = []
token = None
while True:
    kw = {"Bucket": bucket, "Prefix": "l/", "MaxKeys": 2}
    if token:
        kw["ContinuationToken"] = token
    page = s3.list_objects_v2(**kw)
    keys += [o["Key"] for o in page.get("Contents", [])]
    if not page["IsTruncated"]:
        break
    token = page["NextContinuationToken"]
assert keys == ["l/a-b", "l/a/x", "l/a/y/z", "l/a0", "l/b"], keys
# Listings carry each object's ETag (the MD5 of its body), as clients that sync compare it.
page = s3.list_objects_v2(Bucket=bucket, Prefix="l/")
assert {o["Key"]: o["ETag"] for o in page["Contents"]} == {
    k: '"%s"' % hashlib.md5(k.encode()).hexdigest() for k in keys
}, page
page = s3.list_objects_v2(Bucket=bucket, Prefix="l/", Delimiter="/")
assert [o["Key"] for o in page["Contents"]] == ["l/a-b", "l/a0", "l/b"], page
assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["l/a/"], page
page = s3.list_objects_v2(Bucket=bucket, Prefix="l/", StartAfter="l/a/x")
assert [o["Key"] for o in page["Contents"]] == ["l/a/y/z", "l/a0", "l/b"], page
v1 = s3.list_objects(Bucket=bucket, Prefix="l/a", Delimiter="/", MaxKeys=1)
assert [o["Key"] for o in v1.get("Contents", [])] == ["l/a-b"] and v1["IsTruncated"], v1
v1 = s3.list_objects(Bucket=bucket, Prefix="l/a", Delimiter="/", Marker="l/a-b")
assert [p["Prefix"] for p in v1["CommonPrefixes"]] == ["l/a/"], v1
assert [o["Key"] for o in v1["Contents"]] == ["l/a0"], v1

# Copy keeps the body and metadata; DeleteObjects removes, and the emptied prefix goes.
c = s3.copy_object(Bucket=bucket, Key="m/copy.bin", CopySource={"Bucket": bucket, "Key": "m/obj.bin"})
assert c["CopyObjectResult"]["ETag"] == r["ETag"], c
assert s3.get_object(Bucket=bucket, Key="m/copy.bin")["Body"].read() == body
assert s3.head_object(Bucket=bucket, Key="m/copy.bin")["Metadata"] == {"colour": "blue", "n": "7"}
d = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "l/a/x"}, {"Key": "l/a/y/z"}, {"Key": "l/none"}]})
assert sorted(o["Key"] for o in d["Deleted"]) == ["l/a/x", "l/a/y/z", "l/none"], d
page = s3.list_objects_v2(Bucket=bucket, Prefix="l/", Delimiter="/")
assert "CommonPrefixes" not in page, page

# Multipart: parts listed, completion gives the object whole with MD5-of-MD5s-N; abort leaves nothing.
# A part but the last under S3's 5 MiB: EntityTooSmall at completion, nothing made, the upload kept.
u = s3.create_multipart_upload(Bucket=bucket, Key="mp/whole.bin", ContentType="text/plain")["UploadId"]
p1, p2 = b"a" * (5 << 20), b"b" * 1234
small = s3.upload_part(Bucket=bucket, Key="mp/whole.bin", UploadId=u, PartNumber=1, Body=p1[:70000])["ETag"]
e2 = s3.upload_part(Bucket=bucket, Key="mp/whole.bin", UploadId=u, PartNumber=2, Body=p2)["ETag"]
try:
    s3.complete_multipart_upload(Bucket=bucket, Key="mp/whole.bin", UploadId=u, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": small}, {"PartNumber": 2, "ETag": e2}]})
    raise AssertionError("a 70000-byte first part was taken")
except ClientError as e:
    assert e.response["Error"]["Code"] == "EntityTooSmall", e.response
e1 = s3.upload_part(Bucket=bucket, Key="mp/whole.bin", UploadId=u, PartNumber=1, Body=p1)["ETag"]
listed = s3.list_parts(Bucket=bucket, Key="mp/whole.bin", UploadId=u)["Parts"]
assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed] == [(1, len(p1), e1), (2, len(p2), e2)], listed
try:
    s3.head_object(Bucket=bucket, Key="mp/whole.bin")
    raise AssertionError("the object is visible before completion")
except ClientError as e:
    assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 404, e.response
done = s3.complete_multipart_upload(Bucket=bucket, Key="mp/whole.bin", UploadId=u,
                                    MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
want = hashlib.md5(hashlib.md5(p1).digest() + hashlib.md5(p2).digest()).hexdigest() + "-2"
assert done["ETag"] == '"%s"' % want, done
g = s3.get_object(Bucket=bucket, Key="mp/whole.bin")
assert g["Body"].read() == p1 + p2 and g["ContentType"] == "text/plain", g
try:
    s3.list_parts(Bucket=bucket, Key="mp/whole.bin", UploadId=u)
    raise AssertionError("a completed upload is still there")
except ClientError as e:
    assert e.response["Error"]["Code"] == "NoSuchUpload", e.response
u = s3.create_multipart_upload(Bucket=bucket, Key="mp/never.bin")["UploadId"]
s3.upload_part(Bucket=bucket, Key="mp/never.bin", UploadId=u, PartNumber=1, Body=b"x" * 100)
s3.abort_multipart_upload(Bucket=bucket, Key="mp/never.bin", UploadId=u)
keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="")["Contents"]]
assert "mp/never.bin" not in keys and not any(".nasd" in k for k in keys), keys
try:
    s3.upload_part(Bucket=bucket, Key="mp/never.bin", UploadId=u, PartNumber=2, Body=b"y")
    raise AssertionError("an aborted upload took a part")
except ClientError as e:
    assert e.response["Error"]["Code"] == "NoSuchUpload", e.response

# UploadPartCopy: parts made of ranges of an existing object, read as the caller.
u = s3.create_multipart_upload(Bucket=bucket, Key="mp/copied.bin")["UploadId"]
c1 = s3.upload_part_copy(Bucket=bucket, Key="mp/copied.bin", UploadId=u, PartNumber=1,
                         CopySource={"Bucket": bucket, "Key": "mp/whole.bin"})
c2 = s3.upload_part_copy(Bucket=bucket, Key="mp/copied.bin", UploadId=u, PartNumber=2,
                         CopySource={"Bucket": bucket, "Key": "m/obj.bin"}, CopySourceRange="bytes=100-5099")
parts = [{"PartNumber": 1, "ETag": c1["CopyPartResult"]["ETag"]}, {"PartNumber": 2, "ETag": c2["CopyPartResult"]["ETag"]}]
assert parts[1]["ETag"] == '"%s"' % hashlib.md5(body[100:5100]).hexdigest(), c2
try:
    s3.upload_part_copy(Bucket=bucket, Key="mp/copied.bin", UploadId=u, PartNumber=3,
                        CopySource={"Bucket": bucket, "Key": "m/obj.bin"}, CopySourceIfMatch='"0123"')
    raise AssertionError("a copy whose source condition failed was made")
except ClientError as e:
    assert e.response["Error"]["Code"] == "PreconditionFailed", e.response
s3.complete_multipart_upload(Bucket=bucket, Key="mp/copied.bin", UploadId=u, MultipartUpload={"Parts": parts})
assert s3.get_object(Bucket=bucket, Key="mp/copied.bin")["Body"].read() == p1 + p2 + body[100:5100]

# ListMultipartUploads: the uploads in progress, by key, paged with the key and upload-id markers.
ids = {k: s3.create_multipart_upload(Bucket=bucket, Key=k)["UploadId"] for k in ["up/b", "up/a", "up/c/d", "other"]}
listed = s3.list_multipart_uploads(Bucket=bucket, Prefix="up/")
assert [(x["Key"], x["UploadId"]) for x in listed["Uploads"]] == [(k, ids[k]) for k in ["up/a", "up/b", "up/c/d"]], listed
rolled = s3.list_multipart_uploads(Bucket=bucket, Prefix="up/", Delimiter="/")
assert [x["Key"] for x in rolled["Uploads"]] == ["up/a", "up/b"], rolled
assert [p["Prefix"] for p in rolled["CommonPrefixes"]] == ["up/c/"], rolled
seen, kw = [], {"Bucket": bucket, "MaxUploads": 1}
while True:
    page = s3.list_multipart_uploads(**kw)
    seen += [x["Key"] for x in page.get("Uploads", [])]
    if not page["IsTruncated"]:
        break
    kw.update(KeyMarker=page["NextKeyMarker"], UploadIdMarker=page["NextUploadIdMarker"])
assert seen == ["other", "up/a", "up/b", "up/c/d"], seen
for k, i in ids.items():
    s3.abort_multipart_upload(Bucket=bucket, Key=k, UploadId=i)
assert "Uploads" not in s3.list_multipart_uploads(Bucket=bucket) or not s3.list_multipart_uploads(Bucket=bucket)["Uploads"]

for bad in ["x//y", "x/../y", "trailing/"]:
    try:
        s3.put_object(Bucket=bucket, Key=bad, Body=b"no")
        raise AssertionError("key %r was taken" % bad)
    except ClientError as e:
        assert e.response["Error"]["Code"] == "InvalidArgument", (bad, e.response)
try:
    s3.get_object(Bucket=bucket, Key="m/none")
    raise AssertionError("a missing key was found")
except ClientError as e:
    assert e.response["Error"]["Code"] == "NoSuchKey", e.response
# A signed request with a malformed body: MalformedXML, and nothing deleted.
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest

broken = b"<Delete><Object><Key>m/obj.bin</Key>"
req = AWSRequest(method="POST", url="%s/%s?delete" % (endpoint, bucket), data=broken,
                 headers={"Content-MD5": base64.b64encode(hashlib.md5(broken).digest()).decode()})
S3SigV4Auth(boto3.Session().get_credentials(), "s3", "us-east-1").add_auth(req)
prepared = req.prepare()
try:
    urllib.request.urlopen(urllib.request.Request(prepared.url, data=broken, headers=dict(prepared.headers),
                                                  method="POST"))
    raise AssertionError("a malformed DeleteObjects was taken")
except urllib.error.HTTPError as e:
    reply = e.read()
    assert e.code == 400 and b"<Code>MalformedXML</Code>" in reply, (e.code, reply)
assert s3.head_object(Bucket=bucket, Key="m/obj.bin")["ContentLength"] == len(body)
print("boto3 ok")
