#!/usr/bin/env python3
"""1 GiB written and read through the nasd Python client, the native CLI
(`nasd put`/`nasd get`), local files and s3fs over the S3 gateway
(the one `nasd up` serves), all in one run against one fresh `nasd up`
(issue 27).

Each way moves the same file of random bytes:

- **local**: a copy on the local disk (fsync'd), read back in 8 MiB reads.
- **nasd CLI**: `nasd put` / `nasd get` (the baseline: the ratios are to it).
- **python put/get**: `NasdFileSystem.put_file` / `get_file` — the native
  client streams between the local file and the drives, GIL released.
- **python open**: `fs.open(..., "wb")` fed 8 MiB `bytes` from Python /
  `fs.open(..., "rb")` read in 8 MiB reads — every byte passes through Python.
- **s3fs put/get** and **s3fs open**: the same through s3fs at the S3
  gateway `nasd up` runs (plain HTTP on loopback, port manager + 200), as
  its administrator (the key `nasd up` wrote to `nasd-data/s3/credentials`),
  in a bucket of its own.

Every read back is checked against the source (untimed; the `open` reads by
length, the others by BLAKE2b of the file written). The source, the drives
and the gateway share this machine and its page cache: the reads come from
memory on the drive side, the network is loopback.

Run from the repository, release build:

    cargo build --release -p nasd-cli
    (cd python && maturin develop --release)      # or: pip install ./python
    python3 python/bench/bench_client.py --nasd target/release/nasd
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ports import free_port_run

import nasd

MIB = 1024 * 1024
#: Bytes per read or write in the `open` and local ways.
PIECE = 8 * MIB
#: The bucket the s3fs ways use.
S3_BUCKET = "s3bench"
#: What `nasd up` prints once its S3 gateway serves, before the endpoint.
S3_READY = "S3 gateway ready at "
#: Longest a daemon may take to start (a hang, not a measurement).
START_WAIT_MAX = 120.0


def wait_accepting(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_WAIT_MAX
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"daemon did not start:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.05)


def blake2b_file(path: Path) -> str:
    h = hashlib.blake2b()
    with open(path, "rb") as f:
        while piece := f.read(PIECE):
            h.update(piece)
    return h.hexdigest()


def write_random(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, PIECE)
            f.write(os.urandom(n))
            left -= n


class Run:
    def __init__(self, size: int):
        self.size = size
        self.rows: list[tuple[str, str, float]] = []

    def timed(self, way: str, op: str, action) -> None:
        start = time.perf_counter()
        action()
        seconds = time.perf_counter() - start
        self.rows.append((way, op, seconds))
        print(f"  {way:<14} {op:<5} {seconds:7.2f} s  {self.size / MIB / seconds:8.1f} MiB/s", flush=True)

    def table(self, baseline: str) -> str:
        base = {op: s for way, op, s in self.rows if way == baseline}
        lines = ["| way | op | seconds | MiB/s | vs " + baseline + " |", "|---|---|---:|---:|---:|"]
        for way, op, s in self.rows:
            ratio = base[op] / s if op in base else float("nan")
            lines.append(f"| {way} | {op} | {s:.2f} | {self.size / MIB / s:.1f} | {ratio:.2f}x |")
        return "\n".join(lines)


def stream_write(fs, path: str, src: Path) -> None:
    with open(src, "rb") as f, fs.open(path, "wb", block_size=PIECE) as out:
        while piece := f.read(PIECE):
            out.write(piece)


def stream_read(fs, path: str, size: int) -> None:
    got = 0
    with fs.open(path, "rb", block_size=PIECE) as f:
        while piece := f.read(PIECE):
            got += len(piece)
    assert got == size, (got, size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nasd", default="target/release/nasd", help="the nasd binary [target/release/nasd]")
    ap.add_argument("--size-mib", type=int, default=1024, help="file size in MiB [1024]")
    ap.add_argument("--drives", type=int, default=4, help="drives of the cluster [4]")
    ap.add_argument("--dir", default=None, help="where the cluster and local files go [a temporary directory]")
    ap.add_argument("--no-s3", action="store_true", help="skip s3fs over the gateway")
    args = ap.parse_args()
    binary = Path(args.nasd).resolve()
    size = args.size_mib * MIB
    work = Path(tempfile.mkdtemp(prefix="nasd-bench-py.", dir=args.dir))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NASD_")}
    env["NO_COLOR"] = "1"
    procs: list[subprocess.Popen] = []
    try:
        manager = free_port_run(1)
        drive = free_port_run(args.drives)
        capacity = f"{max(2 * args.size_mib * 3 // args.drives + 256, 512)}MiB"
        log = work / "up.log"
        up = ["up", "--drives", str(args.drives), "--manager-port", str(manager)]
        up += ["--first-drive-port", str(drive), "--drive-capacity", capacity]
        if args.no_s3:
            up.append("--no-s3")
        with open(log, "ab") as out:
            procs.append(subprocess.Popen([binary, *up], cwd=work, env=env, stdout=out, stderr=out))
        wait_accepting(manager, procs[-1], log)

        def cli(*a: str) -> str:
            done = subprocess.run([binary, *a], cwd=work, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"nasd {' '.join(a)} failed: {done.stderr}")
            return done.stdout

        cli("mkdir", "/bench")
        src = work / "source.bin"
        write_random(src, size)
        digest = blake2b_file(src)
        fs = nasd.NasdFileSystem(config=work / "nasd-data" / "nasd.toml", skip_instance_cache=True)
        print(f"{args.size_mib} MiB, {args.drives} drives, layout: {cli('layout', 'get', '/bench').strip()}")
        print(f"nasd {binary}, Python {sys.version.split()[0]}, in {work}")
        run = Run(size)

        def check(path: Path) -> None:
            assert blake2b_file(path) == digest, f"{path} differs from the source"
            path.unlink()

        def local_write() -> None:
            shutil.copyfile(src, work / "local.bin")
            with open(work / "local.bin", "rb+") as f:
                os.fsync(f.fileno())

        def local_read() -> None:
            got = 0
            with open(work / "local.bin", "rb") as f:
                while piece := f.read(PIECE):
                    got += len(piece)
            assert got == size

        run.timed("local", "write", local_write)
        run.timed("local", "read", local_read)
        (work / "local.bin").unlink()

        run.timed("nasd CLI", "write", lambda: cli("put", str(src), "/bench/cli.bin"))
        run.timed("nasd CLI", "read", lambda: cli("get", "/bench/cli.bin", str(work / "cli.back")))
        check(work / "cli.back")
        cli("rm", "/bench/cli.bin")

        run.timed("python put/get", "write", lambda: fs.put_file(src, "/bench/put.bin"))
        run.timed("python put/get", "read", lambda: fs.get_file("/bench/put.bin", work / "put.back"))
        check(work / "put.back")
        fs.rm("/bench/put.bin")

        run.timed("python open", "write", lambda: stream_write(fs, "/bench/open.bin", src))
        run.timed("python open", "read", lambda: stream_read(fs, "/bench/open.bin", size))
        fs.get_file("/bench/open.bin", work / "open.back")
        check(work / "open.back")
        fs.rm("/bench/open.bin")

        if not args.no_s3:
            s3 = up_s3(work, procs[0], log)
            s3.mkdir(S3_BUCKET)
            put, opened = f"{S3_BUCKET}/put.bin", f"{S3_BUCKET}/open.bin"
            run.timed("s3fs put/get", "write", lambda: s3.put_file(str(src), put))
            run.timed("s3fs put/get", "read", lambda: s3.get_file(put, str(work / "s3.back")))
            check(work / "s3.back")
            s3.rm(put)
            run.timed("s3fs open", "write", lambda: stream_write(s3, opened, src))
            run.timed("s3fs open", "read", lambda: stream_read(s3, opened, size))
            s3.get_file(opened, str(work / "s3open.back"))
            check(work / "s3open.back")
            s3.rm(opened)

        print()
        print(run.table("nasd CLI"))
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(START_WAIT_MAX)
            except subprocess.TimeoutExpired:
                p.kill()
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


def up_s3(work: Path, up: subprocess.Popen, log: Path):
    """An s3fs file system at the S3 gateway `nasd up` serves, as its
    administrator: the endpoint from up's ready line, the key from the AWS
    credentials file it wrote."""
    import configparser

    import s3fs

    deadline = time.monotonic() + START_WAIT_MAX
    while True:
        said = log.read_text(errors="replace")
        ready = [line for line in said.splitlines() if line.startswith(S3_READY)]
        if ready:
            break
        if up.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"nasd up's S3 gateway did not start:\n{said[-3000:]}")
        time.sleep(0.05)
    endpoint = ready[-1][len(S3_READY) :].split(": ")[0]
    credentials = configparser.ConfigParser()
    credentials.read(work / "nasd-data" / "s3" / "credentials")
    profile = credentials[credentials.sections()[0]]
    # The gateway is plain HTTP on loopback: no CA bundle (this machine sets one for others).
    os.environ.pop("AWS_CA_BUNDLE", None)
    return s3fs.S3FileSystem(
        key=profile["aws_access_key_id"],
        secret=profile["aws_secret_access_key"],
        endpoint_url=endpoint,
        client_kwargs={"region_name": "us-east-1"},
        skip_instance_cache=True,
    )


if __name__ == "__main__":
    main()
