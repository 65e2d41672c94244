"""Uploads in flight through the nasd S3 gateway: a user who holds N PUTs
open (signed, their bodies half sent) gets SlowDown for one more; once
those finish, each is stored whole and the user is served again. Usage:
in_flight_check.py ENDPOINT BUCKET N (keys from the environment). Prints
"in flight ok" at the end."""
import hashlib
import http.client
import select
import sys
import time
import urllib.parse

import boto3
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint, bucket, held = sys.argv[1], sys.argv[2], int(sys.argv[3])
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
credentials = boto3.Session().get_credentials()
host = urllib.parse.urlparse(endpoint).netloc
body = bytes(range(256)) * 4096  # 1 MiB
half = len(body) // 2


def open_put(key):
    """A signed PUT of `body` with only its first half sent."""
    url = "%s/%s/%s" % (endpoint, bucket, key)
    req = AWSRequest(method="PUT", url=url, data=body, headers={"Content-Length": str(len(body))})
    S3SigV4Auth(credentials, "s3", "us-east-1").add_auth(req)
    conn = http.client.HTTPConnection(host, timeout=120)
    conn.putrequest("PUT", "/%s/%s" % (bucket, key), skip_host=True, skip_accept_encoding=True)
    conn.putheader("Host", host)
    for name, value in req.headers.items():
        conn.putheader(name, value)
    conn.endheaders()
    conn.send(body[:half])
    return conn


def refused_early(conn):
    """Whether the gateway has already answered this held PUT: it reached the
    gateway while a probe below held a slot, and was itself refused."""
    if not select.select([conn.sock], [], [], 0)[0]:
        return False
    reply = conn.getresponse()
    text = reply.read()
    assert reply.status == 503 and b"SlowDown" in text, (reply.status, text)
    conn.close()
    return True


conns = [open_put("held/%d" % i) for i in range(held)]
# The held PUTs reach the gateway in their own time: ask until one more is refused.
# A held PUT that arrives while a probe is being written is the one refused;
# it is sent again, so that `held` are open when a probe is refused.
deadline = time.monotonic() + 120
while True:
    for i, conn in enumerate(conns):
        if refused_early(conn):
            conns[i] = open_put("held/%d" % i)
    try:
        s3.put_object(Bucket=bucket, Key="held/one-more", Body=b"x")
        s3.delete_object(Bucket=bucket, Key="held/one-more")
    except ClientError as e:
        assert e.response["Error"]["Code"] == "SlowDown", e.response
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 503, e.response
        break
    assert time.monotonic() < deadline, "no SlowDown with %d uploads held open" % held
    time.sleep(0.05)
for i, conn in enumerate(conns):
    conn.send(body[half:])
    reply = conn.getresponse()
    assert reply.status == 200, (i, reply.status, reply.read())
    conn.close()
for i in range(held):
    assert s3.get_object(Bucket=bucket, Key="held/%d" % i)["Body"].read() == body
s3.put_object(Bucket=bucket, Key="held/one-more", Body=b"x")
print("in flight ok", hashlib.md5(body).hexdigest())
