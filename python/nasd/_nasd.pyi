"""Type stubs of the Rust extension ``nasd._nasd`` (crates/python)."""

from __future__ import annotations

import os
from typing import final

TEMPORARY_SUFFIX: str
"""Suffix of the temporary names files are written under (``.NAME.XXXXXXXX.nasd-tmp``)."""

class LoginError(OSError):
    """Logging in failed: the manager or authentication server could not be
    reached, refused the credentials, or the profile lacks a setting."""

@final
class Stat:
    """A file's status."""

    @property
    def path(self) -> str:
        """Its absolute path in nasd."""
    @property
    def kind(self) -> str:
        """``file``, ``directory``, ``symlink``, ``fifo``, ``socket``, ``char-device`` or ``block-device``."""
    @property
    def size(self) -> int:
        """Length in bytes (directories: entry count)."""
    @property
    def mode(self) -> int:
        """Permission bits."""
    @property
    def uid(self) -> int: ...
    @property
    def gid(self) -> int: ...
    @property
    def nlink(self) -> int: ...
    @property
    def ino(self) -> int: ...
    @property
    def mtime_ns(self) -> int:
        """Last data change, nanoseconds since the Unix epoch."""
    @property
    def ctime_ns(self) -> int:
        """Last attribute change, nanoseconds since the Unix epoch."""
    @property
    def allocated(self) -> int:
        """Bytes of storage its data takes (holes and parity not counted)."""

@final
class Reader:
    """A file open for ranged reads."""

    @property
    def size(self) -> int:
        """The file's size when it was opened."""
    def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer at the end of the file)."""

@final
class Writer:
    """A file being written whole under a temporary name, put in place at ``commit``."""

    @property
    def written(self) -> int:
        """Bytes written so far."""
    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Appends ``data``."""
    def commit(self) -> None:
        """Makes the bytes durable and renames the file onto the target (links it, if
        exclusive; an append is refused with ``BlockingIOError`` if the target changed)."""
    def abort(self) -> None:
        """Drops the bytes written and removes the temporary file; the target is untouched."""

@final
class Client:
    """A logged-in nasd client, safe to share between threads (I/O releases the GIL)."""

    @staticmethod
    def connect(
        manager: str,
        ca_cert: str | os.PathLike[str],
        user: str,
        password: str,
        *,
        server_name: str | None = None,
        auth: str | None = None,
        role: int | None = None,
        failover: list[str] = ...,
        data_integrity: bool = True,
        reply_timeout: float | None = None,
    ) -> Client:
        """Logs in at ``manager`` by password, or with ``auth`` at the
        authentication server and then by the identity key it issues."""
    @staticmethod
    def from_config(
        config: str | os.PathLike[str], *, user: str | None = None, password: str | None = None
    ) -> Client:
        """Logs in with the ``[client]`` section of a config file (``nasd up`` writes DATA/nasd.toml)."""
    @property
    def user(self) -> str: ...
    def stat(self, path: str) -> Stat: ...
    def listdir(self, path: str) -> list[Stat]: ...
    def mkdir(self, path: str, *, parents: bool = False, mode: int = 0o755) -> None: ...
    def rmdir(self, path: str) -> None: ...
    def unlink(self, path: str) -> None: ...
    def rename(self, src: str, dst: str) -> None: ...
    def chmod(self, path: str, mode: int) -> None: ...
    def set_mtime(self, path: str, mtime_ns: int) -> None: ...
    def read(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive; ``None``: the end) of the file."""
    def read_hinted(self, path: str, reads: list[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``(offset, length)`` read of the file, in order; the
        reads are hinted to its drives first, which read them from disk ahead
        (informed prefetching)."""
    def checksum(self, path: str) -> bytes:
        """The file's checksum (32 bytes, BLAKE3) from the digests its drives
        stored: no drive reads the data. Equal for equal bytes under the same
        layout, small-file threshold and drive block sizes."""
    def write(self, path: str, data: bytes | bytearray | memoryview, *, exclusive: bool = False) -> None:
        """Replaces the file with ``data``, atomically (``exclusive``: creates it)."""
    def open_read(self, path: str) -> Reader: ...
    def open_write(self, path: str, exclusive: bool = False) -> Writer: ...
    def open_append(self, path: str) -> Writer:
        """Starts an atomic append: a temporary copy of the file (created if
        missing) takes the bytes written and is renamed onto it at ``commit``,
        which raises ``BlockingIOError`` if the file changed meanwhile."""
    def copy(self, src: str, dst: str) -> None:
        """Copies a file inside nasd (atomically at ``dst``): this library reads
        from and writes to the drives; no bytes pass through Python (nasd has no
        server-side file copy)."""
    def put(self, local: str | os.PathLike[str], remote: str) -> None:
        """Uploads a local file (atomically at ``remote``)."""
    def get(self, remote: str, local: str | os.PathLike[str]) -> None:
        """Downloads to a local file (written beside it, renamed when whole)."""
