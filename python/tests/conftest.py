"""A real `nasd up` cluster for the tests: the debug `nasd` binary cargo built
($NASD_BIN, else target/debug/nasd of this repository), started in a
temporary directory on free loopback ports with two small drives, and logged
in to with the config file it writes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

import nasd

REPO = Path(__file__).resolve().parents[2]
#: Longest the cluster may take to start or stop (a hang, not a timing assertion).
DAEMON_WAIT_MAX = 120.0
#: Ports tried before giving up when the chosen ones are taken meanwhile.
PORT_ATTEMPTS = 5
DRIVES = 2


def nasd_binary() -> Path:
    binary = Path(os.environ.get("NASD_BIN", REPO / "target" / "debug" / "nasd"))
    if not binary.exists():
        pytest.fail(f"no nasd binary at {binary}: run `cargo build -p nasd-cli` or set NASD_BIN", pytrace=False)
    return binary


def free_ports(n: int) -> int:
    """The first of `n` consecutive loopback ports that are free now, with the one below it free too
    (`nasd up` puts its authentication server there)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + n >= 65536:
            continue
        try:
            held = []
            for port in range(first - 1, first + n):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in held:
                s.close()


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Cluster:
    """`nasd up --drives 2` in `cwd`; its config file and its admin's client."""

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.binary = nasd_binary()
        self.log = cwd / "up.log"
        self.config = cwd / "nasd-data" / "nasd.toml"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("NASD_")}
        self.env.update(NASD_LOG="info", NO_COLOR="1")
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.manager_port = free_ports(1)
            drive_port = free_ports(DRIVES)
            args = ["up", "--drives", str(DRIVES), "--manager-port", str(self.manager_port)]
            args += ["--first-drive-port", str(drive_port), "--drive-capacity", "256MiB"]
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(
                    [str(self.binary), *args], cwd=cwd, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
                )
            deadline = time.monotonic() + DAEMON_WAIT_MAX
            while self.proc.poll() is None and not accepts(self.manager_port):
                assert time.monotonic() < deadline, f"nasd up did not accept in time:\n{self.log_tail()}"
                time.sleep(0.05)
            if self.proc.poll() is None:
                return
            if "cannot listen" not in self.log_tail() or attempt == PORT_ATTEMPTS:
                raise RuntimeError(f"nasd up exited at startup ({self.proc.returncode}):\n{self.log_tail()}")

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def nasd(self, *args: str, env: dict[str, str] | None = None) -> str:
        """`nasd ARGS` in the cluster's directory, which must succeed; its standard output."""
        out = subprocess.run(
            [str(self.binary), *args], cwd=self.cwd, env={**self.env, **(env or {})}, capture_output=True, text=True
        )
        assert out.returncode == 0, f"nasd {args} failed: {out.stderr}"
        return out.stdout

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(DAEMON_WAIT_MAX)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("nasd-up"))
    yield c
    c.stop()


@pytest.fixture(scope="session")
def nasd_fs(cluster) -> nasd.NasdFileSystem:
    """The cluster's administrator, logged in with the config file (one client for all tests)."""
    return nasd.NasdFileSystem(config=cluster.config, skip_instance_cache=True)


@pytest.fixture
def scratch(nasd_fs):
    """A fresh directory in nasd, removed with everything in it afterwards."""
    path = f"/t-{uuid.uuid4().hex[:12]}"
    nasd_fs.mkdir(path)
    yield path
    nasd_fs.rm(path, recursive=True)
