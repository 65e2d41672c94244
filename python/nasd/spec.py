"""The fsspec file system over the native client: ``nasd://`` URLs.

Paths are absolute nasd paths; ``nasd:///data/x`` and ``nasd://data/x`` both
name ``/data/x``. Reads fetch the byte ranges asked for (fsspec's read-ahead
buffer in front); writes stream to a temporary file beside the target that is
renamed onto it when the file is closed, so readers see the old file or the
whole new one — a ``with`` block that raises leaves the target untouched.
Appends (``ab``) write to a copy of the file that is renamed onto it at
close, if the file did not change meanwhile.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import time
from glob import has_magic
from typing import Any

import fsspec
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from fsspec.utils import isfilelike, stringify_path

from nasd._nasd import Client, Stat

#: Where the config file is looked for when none is named and $NASD_CONFIG is unset.
DEFAULT_CONFIG = "nasd-data/nasd.toml"

_TYPES = {"file": "file", "directory": "directory"}


def _info(st: Stat) -> dict[str, Any]:
    """The fsspec ``info`` dictionary of a status."""
    return {
        "name": st.path,
        "size": st.size,
        "type": _TYPES.get(st.kind, "other"),
        "kind": st.kind,
        "islink": st.kind == "symlink",
        "mode": st.mode,
        "uid": st.uid,
        "gid": st.gid,
        "nlink": st.nlink,
        "ino": st.ino,
        "mtime": st.mtime_ns / 1e9,
        "mtime_ns": st.mtime_ns,
        "ctime_ns": st.ctime_ns,
    }


class NasdFileSystem(AbstractFileSystem):
    """nasd as an fsspec file system (protocol ``nasd``).

    Log in with the ``[client]`` section of a config file (``config``, else
    ``$NASD_CONFIG``, else ``./nasd-data/nasd.toml``), or with ``manager``,
    ``ca_cert``, ``user`` and ``password`` (and ``auth`` to log in at the
    authentication server and use its identity key), or hand over a logged-in
    ``client``. With ``auto_mkdir`` (the default) writes create missing parent
    directories, as object stores do. Files opened for reading buffer
    ``default_block_size`` bytes (5 MiB) ahead of each read
    (``default_cache_type="readahead"``, good for sequential reads); for
    columnar formats read in ranges, ``"none"`` fetches exactly the ranges
    asked for.
    """

    protocol = "nasd"
    root_marker = "/"

    def __init__(
        self,
        config: str | os.PathLike[str] | None = None,
        *,
        manager: str | None = None,
        ca_cert: str | os.PathLike[str] | None = None,
        user: str | None = None,
        password: str | None = None,
        server_name: str | None = None,
        auth: str | None = None,
        role: int | None = None,
        client: Client | None = None,
        auto_mkdir: bool = True,
        default_block_size: int | None = None,
        default_cache_type: str = "readahead",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.auto_mkdir = auto_mkdir
        self.default_block_size = default_block_size or NasdFile.DEFAULT_BLOCK_SIZE
        self.default_cache_type = default_cache_type
        if client is not None:
            self.client = client
        elif manager is not None:
            if ca_cert is None or user is None or password is None:
                raise ValueError("logging in at a manager needs ca_cert, user and password")
            self.client = Client.connect(
                manager, os.fspath(ca_cert), user, password, server_name=server_name, auth=auth, role=role
            )
        else:
            config = config or os.environ.get("NASD_CONFIG") or DEFAULT_CONFIG
            self.client = Client.from_config(os.fspath(config), user=user, password=password)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        if path.startswith("nasd://"):
            path = path[len("nasd://") :]
        path = "/" + path.lstrip("/")
        return path.rstrip("/") or "/"

    @staticmethod
    def _get_kwargs_from_urls(path):
        return {}

    def unstrip_protocol(self, name: str) -> str:
        return "nasd://" + self._strip_protocol(name)

    # Listing and status.

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        try:
            entries = self.client.listdir(path)
        except NotADirectoryError:
            entries = [self.client.stat(path)]
        if detail:
            return [_info(st) for st in entries]
        return [st.path for st in entries]

    def info(self, path, **kwargs):
        return _info(self.client.stat(self._strip_protocol(path)))

    def modified(self, path) -> datetime.datetime:
        """The last modification of ``path``'s data (UTC)."""
        ns = self.client.stat(self._strip_protocol(path)).mtime_ns
        return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)

    def checksum(self, path) -> int:
        """The checksum of the file ``path`` as fsspec wants it, an ``int``:
        the 32 bytes of ``Client.checksum`` read big-endian (the same bytes
        give the same int). It comes from the digests the drives stored with
        the file's blocks, so no drive reads the data; it is equal for equal
        bytes under the same layout, small-file threshold and drive block
        sizes, and changes with any byte or the size. (``info`` does not
        carry it: it costs a request to each drive of the file.) A
        directory's checksum is that of its status, as fsspec's default."""
        path = self._strip_protocol(path)
        st = self.client.stat(path)
        if st.kind != "file":
            token = f"{st.ino}:{st.kind}:{st.mtime_ns}:{st.ctime_ns}".encode()
            return int.from_bytes(hashlib.blake2b(token, digest_size=32).digest(), "big")
        return int.from_bytes(self.client.checksum(path), "big")

    def ukey(self, path) -> str:
        return f"{self.checksum(path):064x}"

    # Directories.

    def mkdir(self, path, create_parents=True, **kwargs):
        path = self._strip_protocol(path)
        if create_parents:
            if self.exists(path):
                raise FileExistsError(17, "File exists", path)
            self.client.mkdir(path, parents=True)
        else:
            self.client.mkdir(path)

    def makedirs(self, path, exist_ok=False):
        path = self._strip_protocol(path)
        if not exist_ok and self.exists(path):
            raise FileExistsError(17, "File exists", path)
        self.client.mkdir(path, parents=True)

    def rmdir(self, path):
        self.client.rmdir(self._strip_protocol(path))

    def _make_parent(self, path: str) -> None:
        if self.auto_mkdir:
            self.client.mkdir(self._parent(path), parents=True)

    # Files.

    def _rm(self, path):
        path = self._strip_protocol(path)
        if self.client.stat(path).kind == "directory":
            self.client.rmdir(path)
        else:
            self.client.unlink(path)

    def cat_file(self, path, start=None, end=None, **kwargs) -> bytes:
        path = self._strip_protocol(path)
        if (start is not None and start < 0) or (end is not None and end < 0):
            size = self.client.stat(path).size
            start = max(0, size + start) if start is not None and start < 0 else start
            end = max(0, size + end) if end is not None and end < 0 else end
        return self.client.read(path, start or 0, end)

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        path = self._strip_protocol(path)
        self._make_parent(path)
        self.client.write(path, value, exclusive=mode == "create")

    def put_file(self, lpath, rpath, callback=fsspec.callbacks.DEFAULT_CALLBACK, mode="overwrite", **kwargs):
        rpath = self._strip_protocol(rpath)
        if mode == "create" and self.exists(rpath):
            raise FileExistsError(17, "File exists", rpath)
        if os.path.isdir(lpath):
            self.makedirs(rpath, exist_ok=True)
            return
        size = os.path.getsize(lpath)
        callback.set_size(size)
        self._make_parent(rpath)
        self.client.put(os.fspath(lpath), rpath)
        callback.relative_update(size)

    def get_file(self, rpath, lpath, callback=fsspec.callbacks.DEFAULT_CALLBACK, outfile=None, **kwargs):
        rpath = self._strip_protocol(rpath)
        if outfile is None and isfilelike(lpath):
            outfile = lpath
        if outfile is not None:
            data = self.client.read(rpath)
            callback.set_size(len(data))
            outfile.write(data)
            callback.relative_update(len(data))
            return
        if self.isdir(rpath):
            os.makedirs(lpath, exist_ok=True)
            return
        lpath = os.fspath(lpath)
        os.makedirs(os.path.dirname(lpath) or ".", exist_ok=True)
        self.client.get(rpath, lpath)
        callback.relative_update(os.path.getsize(lpath))

    def cp_file(self, path1, path2, **kwargs):
        """Copies the file ``path1`` to ``path2`` (atomically at ``path2``).

        nasd has no server-side file copy (its drives clone objects, but the
        manager offers no file clone), so the native client reads the bytes
        from the drives and writes them back to the drives itself, with the
        GIL released: none of them pass through Python. A directory is
        copied as an empty directory (fsspec copies its files one by one).
        """
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.isdir(path1):
            self.makedirs(path2, exist_ok=True)
            return
        self._make_parent(path2)
        self.client.copy(path1, path2)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """Moves by renaming when one path goes to a name that is not an
        existing directory (atomic, whole trees included); else as fsspec
        does, copying then removing."""
        simple = isinstance(path1, str) and isinstance(path2, str) and maxdepth is None
        if simple and not has_magic(path1) and not path2.endswith("/"):
            src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
            if src == dst:
                return
            if not self.isdir(dst):
                if self.isdir(src) and not recursive:
                    raise IsADirectoryError(21, "Is a directory (pass recursive=True)", src)
                self._make_parent(dst)
                self.client.rename(src, dst)
                return
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    def touch(self, path, truncate=True, **kwargs):
        path = self._strip_protocol(path)
        if truncate or not self.exists(path):
            self.pipe_file(path, b"")
        else:
            self.client.set_mtime(path, time.time_ns())

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        path = self._strip_protocol(path)
        if mode in ("wb", "xb", "ab"):
            self._make_parent(path)
        kwargs.setdefault("cache_type", self.default_cache_type)
        block_size = block_size or self.default_block_size
        return NasdFile(self, path, mode, block_size, autocommit, cache_options=cache_options, **kwargs)


class NasdFile(AbstractBufferedFile):
    """A nasd file opened through fsspec: ``rb`` reads byte ranges as the
    buffer needs them; ``wb`` (``xb``: the file must not exist) streams each
    full block to a temporary file and puts it in place at ``close``; ``ab``
    does the same to a temporary copy of the file (made when it is opened),
    renamed onto it at ``close`` unless the file changed meanwhile, which
    raises ``BlockingIOError`` and drops the appended bytes (see
    ``Client.open_append``)."""

    def __init__(
        self,
        fs: NasdFileSystem,
        path: str,
        mode: str = "rb",
        block_size="default",
        autocommit: bool = True,
        cache_type: str = "readahead",
        cache_options=None,
        **kwargs: Any,
    ) -> None:
        if mode not in ("rb", "wb", "xb", "ab"):
            raise NotImplementedError(f"mode {mode!r}: nasd files are read (rb), written whole (wb, xb) or appended to (ab)")
        self._reader = None
        self._writer = None
        if mode == "rb":
            self._reader = fs.client.open_read(path)
            kwargs["size"] = self._reader.size
        elif mode == "ab":
            # Refuses a directory before any bytes are taken; copies the file's bytes.
            self._writer = fs.client.open_append(path)
        else:
            # Refuses a directory (and, with xb, an existing file) before any bytes are taken.
            self._writer = fs.client.open_write(path, exclusive=mode == "xb")
        super().__init__(fs, path, mode, block_size, autocommit, cache_type, cache_options, **kwargs)
        if mode == "ab":
            self.loc = self._writer.written  # tell() counts from the start of the file

    def _fetch_range(self, start: int, end: int) -> bytes:
        return self._reader.read(start, end - start)

    def _initiate_upload(self) -> None:
        pass

    def _upload_chunk(self, final: bool = False) -> bool:
        try:
            self._writer.write(self.buffer.getvalue())
            if final and self.autocommit:
                self.commit()
        except BaseException:
            # Nothing of this file is committed: its temporary file goes, and a second close
            # (fsspec's at garbage collection) would find nothing to do.
            self.closed = True
            with contextlib.suppress(OSError):
                self._writer.abort()
            raise
        return True

    def commit(self) -> None:
        """Puts the written file in place of the target."""
        self._writer.commit()

    def discard(self) -> None:
        """Drops what was written; the target is left as it was."""
        if self._writer is not None:
            self._writer.abort()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self.writable() and not self.closed:
            self.discard()
            self.closed = True
            return None
        return super().__exit__(exc_type, exc, tb)


fsspec.register_implementation("nasd", NasdFileSystem, clobber=True)
