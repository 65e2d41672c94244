"""Two nasd S3 gateways on one cluster serving one multipart upload, parts
written in place: each part number is sent at once through both gateways
with different bodies (as a client retrying through a load balancer does),
some parts more than twice. Every send is acknowledged; ListParts (through
either gateway) shows, for each part, the ETag of one of its sends, and the
completion (through either) naming those ETags makes the object of exactly
those sends' bytes, never a mix of two. Which gateway does what, and the
order, come from SEED (printed). Usage: two_gateways_check.py ENDPOINT_A
ENDPOINT_B BUCKET PART_BYTES SEED ROUNDS (keys from the environment).
Prints "two gateways ok" at the end."""
import hashlib
import random
import sys
import threading

import boto3
from botocore.config import Config

endpoint_a, endpoint_b, bucket = sys.argv[1], sys.argv[2], sys.argv[3]
P, seed, rounds = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
print("seed", seed)
rng = random.Random(seed)
config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, max_pool_connections=16)
gateways = [boto3.client("s3", endpoint_url=e, region_name="us-east-1", config=config)
            for e in (endpoint_a, endpoint_b)]


def etag_of(parts):
    digests = b"".join(hashlib.md5(p).digest() for p in parts)
    return '"%s-%d"' % (hashlib.md5(digests).hexdigest(), len(parts))


def one_round(r):
    key = "two/round-%d.bin" % r
    uid = rng.choice(gateways).create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    sizes = {n: P for n in range(1, 5)}
    sizes[5] = rng.randrange(1, P)
    sends = []
    for n in sizes:
        for _ in range(rng.choice([2, 2, 3])):
            sends.append((n, rng.randbytes(sizes[n]), rng.randrange(2)))
    rng.shuffle(sends)
    bodies = {}
    errors = []

    def send(n, body, g):
        try:
            got = gateways[g].upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=n, Body=body)["ETag"]
            assert got == '"%s"' % hashlib.md5(body).hexdigest(), (n, got)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    for n, body, _ in sends:
        bodies[(n, '"%s"' % hashlib.md5(body).hexdigest())] = body
    threads = [threading.Thread(target=send, args=s) for s in sends]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    listed = rng.choice(gateways).list_parts(Bucket=bucket, Key=key, UploadId=uid)["Parts"]
    assert [p["PartNumber"] for p in listed] == sorted(sizes), listed
    chosen = []
    for p in listed:
        body = bodies.get((p["PartNumber"], p["ETag"]))
        assert body is not None, ("ListParts shows an ETag no send had", p)
        assert p["Size"] == len(body), p
        chosen.append(body)
    named = {"Parts": [{"PartNumber": p["PartNumber"], "ETag": p["ETag"]} for p in listed]}
    done = rng.choice(gateways).complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid,
                                                          MultipartUpload=named)
    assert done["ETag"] == etag_of(chosen), (r, done["ETag"])
    back = rng.choice(gateways).get_object(Bucket=bucket, Key=key)["Body"].read()
    assert back == b"".join(chosen), (r, "the object mixes sends of one part")
    print("round %d: %d sends, ok" % (r, len(sends)))


for r in range(rounds):
    one_round(r)
print("two gateways ok")
