"""A part sent again that fails, and a completion that fails, lose no
acknowledged part (S3's semantics) on the nasd S3 gateway, parts written in
place. Each round makes an upload of parts 1..4 of the part size and a short
last part, all acknowledged, then sends parts again: some whole (the new copy
wins), some that fail — cut off mid-body (the connection reset), a body
shorter than its Content-Length (the request's write side closed, its answer
read), a body whose Content-MD5 does not match. ListParts must still show
the copy last acknowledged of every part. Then the round completes: at once;
or first with the key's parent an object (the completion fails halfway, after
the staging file was prepared), then again once the parent is gone; or first
cut off after a delay (the connection reset), then again — answered as the
first. The object must be the parts last acknowledged, with their
MD5-of-MD5s-N ETag, and no upload left. Which part, where the cut falls,
which failure and which completion come from SEED (printed). Usage:
resend_check.py ENDPOINT BUCKET PART_BYTES SEED ROUNDS (keys from the
environment). Prints "resend ok" at the end."""
import base64
import hashlib
import random
import socket
import struct
import sys
import time
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint, bucket, part_bytes, seed, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
    int(sys.argv[5])
print("seed", seed)
rng = random.Random(seed)
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
P = part_bytes


class Captured(Exception):
    """Raised by the before-send hook: the request, signed, not sent."""

    def __init__(self, request):
        super().__init__("captured")
        self.request = request


def capture(request, **_):
    raise Captured(request)


def signed(call, **kwargs):
    """The request boto3 would send for `call(**kwargs)`, signed, unsent."""
    s3.meta.events.register_first("before-send.s3.*", capture)
    try:
        call(**kwargs)
    except Captured as c:
        return c.request
    finally:
        s3.meta.events.unregister("before-send.s3.*", capture)
    raise AssertionError("the request was sent")


def raw_head(request, length):
    """The request line and headers of `request`, with Content-Length `length`."""
    url = urlsplit(request.url)
    path = url.path + ("?" + url.query if url.query else "")
    lines = ["%s %s HTTP/1.1" % (request.method, path), "Host: %s" % url.netloc]
    for name, value in request.headers.items():
        if name.lower() in ("host", "content-length", "transfer-encoding", "expect"):
            continue
        value = value.decode() if isinstance(value, bytes) else value
        lines.append("%s: %s" % (name, value))
    lines.append("Content-Length: %d" % length)
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def body_of(request):
    body = request.body
    if body is None:
        return b""
    if hasattr(body, "read"):
        body.seek(0)
        return body.read()
    return body if isinstance(body, bytes) else body.encode()


def connect(request):
    url = urlsplit(request.url)
    return socket.create_connection((url.hostname, url.port))


def reset(sock):
    """Closes `sock` with a reset: the peer sees the connection cut off."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def read_answer(sock):
    sock.settimeout(60)
    out = b""
    try:
        while True:
            got = sock.recv(65536)
            if not got:
                break
            out += got
            if b"\r\n\r\n" in out and (b"</Error>" in out or b"Content-Length: 0" in out):
                break
    except (ConnectionResetError, socket.timeout):
        pass
    sock.close()
    return out


def failed_resend(key, uid, number, body, how, cut):
    """Sends part `number` again with `body`, failing as `how` says."""
    if how == "bad-md5":
        wrong = base64.b64encode(hashlib.md5(body + b"x").digest()).decode()
        try:
            s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=number, Body=body, ContentMD5=wrong)
            raise AssertionError("a part with a wrong Content-MD5 was taken")
        except ClientError as e:
            assert e.response["Error"]["Code"] == "BadDigest", e.response
        return
    request = signed(s3.upload_part, Bucket=bucket, Key=key, UploadId=uid, PartNumber=number, Body=body)
    whole = body_of(request)
    sock = connect(request)
    sock.sendall(raw_head(request, len(whole)) + whole[:cut])
    if how == "reset":
        reset(sock)
    else:
        sock.shutdown(socket.SHUT_WR)
        answer = read_answer(sock)
        assert b" 200 " not in answer.split(b"\r\n", 1)[0], answer[:300]


def etag_of(parts):
    digests = b"".join(hashlib.md5(p).digest() for p in parts)
    return '"%s-%d"' % (hashlib.md5(digests).hexdigest(), len(parts))


def listed_parts(key, uid):
    return [(p["PartNumber"], p["Size"], p["ETag"]) for p in s3.list_parts(Bucket=bucket, Key=key, UploadId=uid)["Parts"]]


def complete(key, uid, acked, how):
    named = {"Parts": [{"PartNumber": n, "ETag": acked[n][1]} for n in sorted(acked)]}
    if how == "blocked":
        parent = key.split("/")[0]
        s3.put_object(Bucket=bucket, Key=parent, Body=b"in the way")
        try:
            s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, MultipartUpload=named)
            raise AssertionError("a completion under an object completed")
        except ClientError as e:
            print("blocked completion:", e.response["Error"]["Code"])
        assert listed_parts(key, uid) == [(n, len(acked[n][0]), acked[n][1]) for n in sorted(acked)], \
            "a failed completion changed the parts"
        s3.delete_object(Bucket=bucket, Key=parent)
    elif how == "cut":
        request = signed(s3.complete_multipart_upload, Bucket=bucket, Key=key, UploadId=uid, MultipartUpload=named)
        whole = body_of(request)
        sock = connect(request)
        sock.sendall(raw_head(request, len(whole)) + whole)
        time.sleep(rng.uniform(0, 0.2))
        reset(sock)
    return s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, MultipartUpload=named)


def one_round(r):
    key = "round-%d/object.bin" % r
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    acked = {}

    def send(number, body):
        got = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=number, Body=body)["ETag"]
        assert got == '"%s"' % hashlib.md5(body).hexdigest(), (number, got)
        acked[number] = (body, got)

    sizes = {1: P, 2: P, 3: P, 4: P, 5: rng.randrange(1, P)}
    for n in rng.sample(sorted(sizes), len(sizes)):
        send(n, rng.randbytes(sizes[n]))
    for _ in range(rng.randrange(1, 5)):
        number = rng.choice(sorted(sizes))
        body = rng.randbytes(sizes[number])
        how = rng.choice(["whole", "reset", "short", "bad-md5"])
        cut = rng.randrange(1, len(body))
        print("round %d: part %d sent again, %s, cut at %d of %d" % (r, number, how, cut, len(body)))
        if how == "whole":
            send(number, body)
        else:
            failed_resend(key, uid, number, body, how, cut)
    want = [(n, len(acked[n][0]), acked[n][1]) for n in sorted(acked)]
    assert listed_parts(key, uid) == want, (r, "a failed part sent again lost the copy acknowledged", want)
    how = rng.choice(["at-once", "blocked", "cut"])
    print("round %d: completion %s" % (r, how))
    done = complete(key, uid, acked, how)
    bodies = [acked[n][0] for n in sorted(acked)]
    assert done["ETag"] == etag_of(bodies), (r, done["ETag"], etag_of(bodies))
    got = s3.get_object(Bucket=bucket, Key=key)
    back = got["Body"].read()
    assert back == b"".join(bodies), (r, "the object differs from the parts acknowledged", len(back))
    assert got["ETag"] == etag_of(bodies), (r, got["ETag"])
    left = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert all(u["UploadId"] != uid for u in left), (r, left)


for r in range(rounds):
    one_round(r)
print("resend ok")
