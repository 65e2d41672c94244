"""Loopback ports for the benchmarks' own clusters (shared by bench_client.py and bench_nfs.py)."""

from __future__ import annotations

import socket


def free_port_run(n: int) -> int:
    """The first of `n` consecutive free loopback ports, with the one below free too (`nasd up`'s auth server)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        held = []
        try:
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
