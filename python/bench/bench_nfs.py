#!/usr/bin/env python3
"""`nfs-cp` through `nasd nfs` beside Debian's nfs-ganesha (VFS backend)
serving a local directory and beside the nasd FUSE mount, in one run
(issue 28).

Workloads, each way moving the same bytes:

- **large**: one file of random bytes (1 GiB unless --size-mib) copied in,
  then out.
- **small**: --files files of 1 to 16 KiB copied in one by one, then out
  one by one (one client process per file, as `nfs-cp` works).

Ways:

- **nasd nfs**: libnfs's `nfs-cp` to and from `nasd nfs` (exporting
  `/bench`) over a fresh `nasd up --drives 4 --no-s3`, as uid 1000.
- **ganesha**: the same `nfs-cp` to and from `ganesha.nfsd` (NFSv3, VFS
  FSAL) exporting a local directory on this machine's disk, as uid 1000.
  Needs `nfs-ganesha nfs-ganesha-vfs` installed and rpcbind running
  (`rpcbind -w`): ganesha stops if it cannot register.
- **FUSE mount**: `cp` to and from `nasd mount` of the same cluster.

Every file read back is compared with its source (untimed). Everything
shares the machine's cores, disk and page cache over loopback; the ratios
("vs ganesha": ganesha's seconds over the way's, above 1 is faster) are the
result, single figures swing on a loaded machine.

Run from the repository, release build:

    cargo build --release -p nasd-cli
    python3 python/bench/bench_nfs.py --nasd target/release/nasd
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ports import free_port_run

MIB = 1 << 20
START_WAIT_MAX = 120.0
UID = 1000


def wait_for(what: str, done, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_WAIT_MAX
    while not done():
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"{what} did not start:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.05)


def accepting(port: int):
    def check() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    return check


def digest(path: Path) -> str:
    h = hashlib.blake2b()
    with open(path, "rb") as f:
        while piece := f.read(8 * MIB):
            h.update(piece)
    return h.hexdigest()


def run(*cmd: str, cwd: Path | None = None, env=None) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {done.stderr}")
    return done.stdout


class Way:
    """How one way copies a file in (`put`) and out (`get`)."""

    def __init__(self, name: str, put, get):
        self.name, self.put, self.get = name, put, get


def nfs_way(name: str, host_path: str, nfsport: int, mountport: int) -> Way:
    def url(rel: str) -> str:
        return f"nfs://127.0.0.1{host_path}/{rel}?nfsport={nfsport}&mountport={mountport}&uid={UID}&gid={UID}"

    return Way(name, lambda src, rel: run("nfs-cp", str(src), url(rel)), lambda rel, dst: run("nfs-cp", url(rel), str(dst)))


def mount_way(point: Path) -> Way:
    return Way("FUSE mount", lambda src, rel: run("cp", str(src), str(point / rel)),
               lambda rel, dst: run("cp", str(point / rel), str(dst)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nasd", default="target/release/nasd")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--files", type=int, default=300)
    ap.add_argument("--dir", default=None, help="where to work [default: a new directory in /tmp]")
    args = ap.parse_args()
    binary = Path(args.nasd).resolve()
    work = Path(tempfile.mkdtemp(prefix="nasd-bench-nfs.", dir=args.dir))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NASD_")}
    env["NO_COLOR"] = "1"
    procs: list[subprocess.Popen] = []
    point = work / "mnt"
    rng = random.Random(28)
    try:
        manager = free_port_run(1)
        drive = free_port_run(4)
        capacity = f"{max(2 * args.size_mib * 3 // 4 + 512, 1024)}MiB"
        log = work / "up.log"
        up = ["up", "--drives", "4", "--manager-port", str(manager), "--first-drive-port", str(drive),
              "--drive-capacity", capacity, "--no-s3"]
        with open(log, "ab") as out:
            procs.append(subprocess.Popen([binary, *up], cwd=work, env=env, stdout=out, stderr=out))
        wait_for("nasd up", accepting(manager), procs[-1], log)

        def cli(*a: str) -> str:
            return run(str(binary), *a, cwd=work, env=env)

        cli("admin", "set-gateway", "admin", "--ids", "1000-60000")
        cli("mkdir", "/bench")
        cli("chmod", "777", "/bench")

        nfs_port = free_port_run(1)
        nfs_log = work / "nfs.log"
        with open(nfs_log, "ab") as out:
            procs.append(subprocess.Popen([binary, "nfs", "--listen", f"127.0.0.1:{nfs_port}", "--export", "/bench"],
                                          cwd=work, env=env, stdout=out, stderr=out))
        wait_for("nasd nfs", accepting(nfs_port), procs[-1], nfs_log)

        export = work / "ganesha-export"
        export.mkdir()
        export.chmod(0o777)
        g_nfs, g_mnt = free_port_run(1), free_port_run(1)
        conf = work / "ganesha.conf"
        conf.write_text(f"""NFS_CORE_PARAM {{
    Protocols = 3; NFS_Port = {g_nfs}; MNT_Port = {g_mnt}; Bind_addr = 127.0.0.1;
    Enable_NLM = false; Enable_RQUOTA = false;
}}
NFSV4 {{ Graceless = true; }}
EXPORT {{
    Export_Id = 1; Path = {export}; Pseudo = /bench; Access_Type = RW; Squash = No_Root_Squash;
    SecType = sys; Protocols = 3; Transports = TCP;
    FSAL {{ Name = VFS; }}
}}
""")
        g_log = work / "ganesha.log"
        procs.append(subprocess.Popen(["ganesha.nfsd", "-F", "-f", str(conf), "-L", str(g_log),
                                       "-p", str(work / "ganesha.pid"), "-N", "NIV_EVENT"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for("ganesha.nfsd", accepting(g_nfs), procs[-1], g_log)

        point.mkdir()
        m_log = work / "mount.log"
        with open(m_log, "ab") as out:
            procs.append(subprocess.Popen([binary, "mount", str(point)], cwd=work, env=env, stdout=out, stderr=out))
        wait_for("nasd mount", lambda: "mounted at" in m_log.read_text(errors="replace"), procs[-1], m_log)
        (point / "bench" / "fuse").mkdir()

        ways = [
            nfs_way("nasd nfs", "/bench", nfs_port, nfs_port),
            nfs_way("ganesha", str(export), g_nfs, g_mnt),
            mount_way(point / "bench" / "fuse"),
        ]

        large = work / "large.bin"
        with open(large, "wb") as f:
            for _ in range(args.size_mib):
                f.write(os.urandom(MIB))
        large_digest = digest(large)
        small_dir = work / "small"
        small_dir.mkdir()
        smalls = []
        for i in range(args.files):
            p = small_dir / f"f{i:05}"
            p.write_bytes(rng.randbytes(rng.randint(1024, 16 * 1024)))
            smalls.append(p)
        small_bytes = sum(p.stat().st_size for p in smalls)
        print(f"nasd {binary}; {args.size_mib} MiB large file; {args.files} small files, {small_bytes} bytes; in {work}")
        print(f"load average {os.getloadavg()[0]:.1f} at start on {os.cpu_count()} cores")

        results: dict[tuple[str, str], float] = {}
        for way in ways:
            back = work / "back"
            back.mkdir()
            t = time.monotonic()
            way.put(large, "large.bin")
            results[(way.name, "large in")] = time.monotonic() - t
            t = time.monotonic()
            way.get("large.bin", back / "large.bin")
            results[(way.name, "large out")] = time.monotonic() - t
            assert digest(back / "large.bin") == large_digest, f"{way.name}: the large file differs"
            (back / "large.bin").unlink()
            t = time.monotonic()
            for p in smalls:
                way.put(p, p.name)
            results[(way.name, "small in")] = time.monotonic() - t
            t = time.monotonic()
            for p in smalls:
                way.get(p.name, back / p.name)
            results[(way.name, "small out")] = time.monotonic() - t
            for p in smalls:
                assert (back / p.name).read_bytes() == p.read_bytes(), f"{way.name}: {p.name} differs"
            shutil.rmtree(back)
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
        print()
        print("| way | workload | seconds | rate | vs ganesha |")
        print("|---|---|---:|---:|---:|")
        for work_name in ["large in", "large out", "small in", "small out"]:
            for way in ways:
                s = results[(way.name, work_name)]
                rate = f"{args.size_mib / s:.1f} MiB/s" if work_name.startswith("large") else f"{args.files / s:.1f} files/s"
                ratio = results[("ganesha", work_name)] / s
                print(f"| {way.name} | {work_name} | {s:.2f} | {rate} | {ratio:.2f}x |")
    finally:
        if point.exists():
            subprocess.run(["fusermount", "-u", str(point)], capture_output=True)
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(START_WAIT_MAX)
            except subprocess.TimeoutExpired:
                p.kill()
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
