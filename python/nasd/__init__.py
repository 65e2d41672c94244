"""nasd: a native Python client for the nasd secure network-attached storage.

``Client`` (from the Rust extension ``nasd._nasd``) logs in and reads and writes
files straight to the drives; ``NasdFileSystem`` is the fsspec file system over
it, registered as the ``nasd://`` protocol, so ``pandas.read_parquet("nasd:///x")``
and friends work.

Log in one of three ways::

    fs = nasd.NasdFileSystem(config="nasd-data/nasd.toml")     # [client] of `nasd up`
    fs = nasd.NasdFileSystem(manager="host:7300", ca_cert="ca.pem",
                             user="alice", password="...")     # password at the manager
    fs = nasd.NasdFileSystem(manager="host:7300", ca_cert="ca.pem", user="alice",
                             password="...", auth="host:7299")  # identity key from the auth server

Without arguments the config file is ``$NASD_CONFIG``, else ``./nasd-data/nasd.toml``.
Failures raise ``OSError`` subclasses (``FileNotFoundError``, ``PermissionError``,
``IsADirectoryError``, ``NotADirectoryError``, ``FileExistsError``, …) with nasd's
message; a failed login raises ``nasd.LoginError``.
"""

from nasd._nasd import Client, LoginError, Reader, Stat, Writer
from nasd.spec import NasdFile, NasdFileSystem

__all__ = ["Client", "LoginError", "NasdFile", "NasdFileSystem", "Reader", "Stat", "Writer"]
