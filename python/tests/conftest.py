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
import tomllib
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

import nasd

REPO = Path(__file__).resolve().parents[2]
#: Longest the cluster may take to start or stop (a hang, not a timing assertion).
DAEMON_WAIT_MAX = 120.0
#: Ports tried before giving up when the chosen ones are taken meanwhile.
PORT_ATTEMPTS = 5
DRIVES = 2
#: Audit records asked for per `nasd audit` call (the drive's limit, READ_AUDIT's 512).
AUDIT_PAGE = 512
#: The opcode of READ as `nasd audit` prints it (docs/PROTOCOL.md).
READ_OPCODE = "0x0105"


@dataclass(frozen=True)
class AuditRecord:
    """One line of `nasd audit`: sequence, opcode, status and the request's
    first region (offset+length)."""

    sequence: int
    opcode: str
    status: str
    offset: int
    length: int

    @staticmethod
    def parse(line: str) -> "AuditRecord | None":
        fields = line.split()
        if len(fields) < 9 or not fields[0].isdigit() or not fields[4].startswith("0x"):
            return None
        offset, length = fields[8].split("+")
        return AuditRecord(int(fields[0]), fields[4], fields[5], int(offset), int(length))


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

    def drive_numbers(self) -> list[int]:
        """The drives `nasd up` recorded in its config file ([[drives]])."""
        with open(self.config, "rb") as f:
            return [d["number"] for d in tomllib.load(f)["drives"]]

    def audit_page(self, drive: int, after: int) -> list[AuditRecord]:
        """Up to `AUDIT_PAGE` of drive `drive`'s audit records after sequence
        number `after` (`nasd audit`, authorized by the drive key `nasd up` saved)."""
        out = self.nasd("audit", "--drive", str(drive), "--after", str(after), "--max", str(AUDIT_PAGE))
        return [r for r in map(AuditRecord.parse, out.splitlines()) if r is not None]

    def audit(self, drive: int, after: int) -> list[AuditRecord]:
        """Every audit record of drive `drive` after sequence number `after`,
        up to a short page: each `nasd audit` adds its own READ_AUDIT record,
        so the trail never ends for a reader who waits for an empty page."""
        records = []
        while True:
            page = self.audit_page(drive, after)
            records += page
            if len(page) < AUDIT_PAGE:
                return records
            after = page[-1].sequence

    def last_audit_sequence(self, drive: int) -> int:
        """Drive `drive`'s last audit sequence number now (0: none), found by
        galloping then bisecting over `--after` rather than reading the trail."""
        known, beyond, step = 0, None, AUDIT_PAGE
        while True:
            if beyond is not None and beyond - known <= AUDIT_PAGE:
                records = self.audit(drive, known)
                return records[-1].sequence if records else known
            probe = known + step if beyond is None else (known + beyond) // 2
            page = self.audit_page(drive, probe)
            if page:
                known = page[-1].sequence
                if len(page) < AUDIT_PAGE:
                    return known
                step *= 2
            else:
                beyond = probe

    def audit_marks(self) -> dict[int, int]:
        """Each drive's last audit sequence number now."""
        return {drive: self.last_audit_sequence(drive) for drive in self.drive_numbers()}

    def bytes_read_at_drives(self, since: dict[int, int]) -> int:
        """Bytes the successful READ requests the drives served since `since`
        (from `audit_marks`) asked for: what the drives' audit trails record,
        not what any client counted. A drive audits a request's first region
        only; the striping engine asks a component for one region per
        contiguous run of a read, and the tests check the count against a
        whole read."""
        total = 0
        for drive, after in since.items():
            for r in self.audit(drive, after):
                if r.opcode == READ_OPCODE and r.status == "OK":
                    total += r.length
        return total

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
