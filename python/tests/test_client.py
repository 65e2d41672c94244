"""The client beyond fsspec's suite: the three ways to log in, errors as the
Python exceptions callers expect, atomic writes, ranges, times, checksums,
moves, large transfers, and one client shared by many threads."""

import errno
import os
import random
import threading
import tomllib
from concurrent.futures import ThreadPoolExecutor

import pytest

import nasd


def client_section(cluster) -> dict:
    with open(cluster.config, "rb") as f:
        return tomllib.load(f)["client"]


def admin_password(section) -> str:
    with open(section["password_file"]) as f:
        return f.read().strip()


@pytest.fixture(scope="module")
def bob(cluster):
    """A second user, `bob`, added at the authentication server, and his password."""
    password = "bob's long passphrase"
    cluster.nasd("auth", "add-user", "bob", "--uid", "2001", env={"NASD_NEW_PASSWORD": password})
    return password


def test_logs_in_with_the_config_file_and_with_an_identity_key(cluster, nasd_fs):
    section = client_section(cluster)
    assert nasd_fs.client.user == section["user"]
    by_key = nasd.Client.connect(
        section["manager"], section["ca_cert"], section["user"], admin_password(section), auth=section["auth"]
    )
    by_key.write("/login-check", b"seen by both")
    assert nasd_fs.cat_file("/login-check") == b"seen by both"
    nasd_fs.rm("/login-check")


def test_a_password_at_a_manager_linked_to_an_authentication_server_is_refused_with_its_reason(cluster):
    section = client_section(cluster)
    with pytest.raises(nasd.LoginError, match="login as 'admin'"):
        nasd.Client.connect(section["manager"], section["ca_cert"], section["user"], admin_password(section))


def test_a_wrong_password_or_a_missing_setting_fails_the_login(cluster, tmp_path):
    section = client_section(cluster)
    with pytest.raises(nasd.LoginError, match="authentication server"):
        nasd.Client.connect(section["manager"], section["ca_cert"], "admin", "wrong", auth=section["auth"])
    bare = tmp_path / "nasd.toml"
    bare.write_text('[client]\nuser = "admin"\n')
    with pytest.raises(nasd.LoginError, match="no manager address configured"):
        nasd.Client.from_config(str(bare), password="x")
    with pytest.raises(nasd.LoginError, match="cannot read config file"):
        nasd.Client.from_config(str(tmp_path / "missing.toml"))


def test_failures_are_the_exceptions_python_code_expects(nasd_fs, scratch):
    with pytest.raises(FileNotFoundError) as e:
        nasd_fs.cat_file(f"{scratch}/missing")
    assert e.value.errno == errno.ENOENT and e.value.filename == f"{scratch}/missing"
    assert str(e.value.strerror)
    nasd_fs.pipe_file(f"{scratch}/file", b"x")
    with pytest.raises(IsADirectoryError):
        nasd_fs.cat_file(scratch)
    with pytest.raises(IsADirectoryError):
        nasd_fs.pipe_file(scratch, b"x")
    with pytest.raises(NotADirectoryError):
        nasd_fs.client.listdir(f"{scratch}/file")
    with pytest.raises(NotADirectoryError):
        nasd_fs.pipe_file(f"{scratch}/file/below", b"x")
    with pytest.raises(FileExistsError):
        nasd_fs.mkdir(scratch, create_parents=False)
    with pytest.raises(FileExistsError):
        nasd_fs.open(f"{scratch}/file", "xb")
    with pytest.raises(OSError) as e:
        nasd_fs.rmdir(scratch)
    assert e.value.errno == errno.ENOTEMPTY
    with pytest.raises(FileNotFoundError):
        nasd_fs.info(f"{scratch}/missing")
    assert not nasd_fs.exists(f"{scratch}/missing")


def test_another_user_meets_permission_errors(cluster, nasd_fs, scratch, bob):
    section = client_section(cluster)
    nasd_fs.pipe_file(f"{scratch}/private", b"admin only")
    nasd_fs.client.chmod(f"{scratch}/private", 0o600)
    as_bob = nasd.NasdFileSystem(
        manager=section["manager"], ca_cert=section["ca_cert"], user="bob", password=bob,
        auth=section["auth"], skip_instance_cache=True,
    )
    with pytest.raises(PermissionError) as e:
        as_bob.cat_file(f"{scratch}/private")
    assert e.value.errno == errno.EACCES
    with pytest.raises(PermissionError):
        as_bob.checksum(f"{scratch}/private")
    with pytest.raises(PermissionError):
        as_bob.pipe_file(f"{scratch}/bobs", b"not here")
    assert nasd_fs.ls(scratch, detail=False) == [f"{scratch}/private"]


#: The opcode of DIGESTS as `nasd audit` prints it (docs/PROTOCOL.md).
DIGESTS_OPCODE = "0x010f"


def test_checksums_are_the_stored_digests(nasd_fs, cluster, scratch):
    seed = random.randrange(2**32)
    print(f"checksum test seed {seed}")
    rng = random.Random(seed)
    data = bytearray(rng.randbytes(3 * 1024 * 1024 + rng.randrange(100_000)))
    zeros = rng.randrange(len(data) // 2)
    data[zeros : zeros + 300_000] = bytes(300_000)
    data = bytes(data)
    nasd_fs.pipe_file(f"{scratch}/whole", data)
    with nasd_fs.open(f"{scratch}/pieces", "wb", block_size=5 * 1024 * 1024) as f:
        at = 0
        while at < len(data):
            n = rng.randrange(1, 700_000)
            f.write(data[at : at + n])
            at += n
    changed = bytearray(data)
    changed[rng.randrange(len(data))] ^= 0x01
    nasd_fs.pipe_file(f"{scratch}/changed", bytes(changed))

    since = cluster.audit_marks()
    whole = nasd_fs.checksum(f"{scratch}/whole")
    assert isinstance(whole, int) and 0 < whole < 2**256
    assert nasd_fs.checksum(f"{scratch}/pieces") == whole, "equal bytes, written otherwise"
    assert nasd_fs.checksum(f"{scratch}/changed") != whole, "one byte changed"
    assert nasd_fs.client.checksum(f"{scratch}/whole") == whole.to_bytes(32, "big")
    assert nasd_fs.ukey(f"{scratch}/whole") == f"{whole:064x}"
    # The drives answered from their stored digests (DIGESTS in their audit
    # trails) and read none of the data.
    assert cluster.bytes_read_at_drives(since) == 0
    digests = [r for d, after in since.items() for r in cluster.audit(d, after) if r.opcode == DIGESTS_OPCODE]
    assert digests and all(r.status == "OK" for r in digests)


def test_a_write_is_seen_whole_at_close_and_not_at_all_if_it_fails(nasd_fs, scratch):
    path = f"{scratch}/atomic"
    nasd_fs.pipe_file(path, b"old")
    block = 64 * 1024
    f = nasd_fs.open(path, "wb", block_size=block)
    for i in range(5):
        f.write(bytes([i]) * block)
    assert nasd_fs.cat_file(path) == b"old"
    temporaries = [p for p in nasd_fs.ls(scratch, detail=False) if p.endswith(nasd._nasd.TEMPORARY_SUFFIX)]
    assert len(temporaries) == 1, nasd_fs.ls(scratch, detail=False)
    f.close()
    assert nasd_fs.cat_file(path) == b"".join(bytes([i]) * block for i in range(5))
    assert nasd_fs.ls(scratch, detail=False) == [path]

    with pytest.raises(RuntimeError):
        with nasd_fs.open(path, "wb", block_size=block) as f:
            f.write(b"n" * 3 * block)
            raise RuntimeError("the writer failed")
    assert nasd_fs.cat_file(path)[:block] == b"\0" * block
    assert nasd_fs.ls(scratch, detail=False) == [path]


def test_hinted_reads_come_back_in_order(nasd_fs, scratch):
    path = f"{scratch}/hinted"
    data = bytes(range(256)) * 4096  # 1 MiB: on the drives, past the small-file threshold
    nasd_fs.pipe_file(path, data)
    reads = [(700_000, 100), (3, 5), (1_048_570, 100), (65_536, 4096)]
    got = nasd_fs.client.read_hinted(path, reads)
    assert got == [data[o : o + n] for o, n in reads]


def test_ranges_times_checksums_and_moves(nasd_fs, scratch):
    path = f"{scratch}/digits"
    nasd_fs.pipe_file(path, b"0123456789")
    assert nasd_fs.cat_file(path, start=2, end=5) == b"234"
    assert nasd_fs.cat_file(path, start=-3) == b"789"
    assert nasd_fs.cat_file(path, start=8, end=100) == b"89"
    assert nasd_fs.cat_file(path, start=20) == b""
    with nasd_fs.open(path, "rb") as f:
        f.seek(4)
        assert f.read(3) == b"456"
    info = nasd_fs.info(path)
    assert (info["type"], info["size"], info["name"]) == ("file", 10, path)

    stamp = 1_700_000_000_123_456_789
    nasd_fs.client.set_mtime(path, stamp)
    modified = nasd_fs.modified(path)
    assert modified.tzinfo is not None and int(modified.timestamp()) == stamp // 10**9
    before = nasd_fs.checksum(path)
    assert nasd_fs.checksum(path) == before
    nasd_fs.pipe_file(path, b"9876543210")
    assert nasd_fs.checksum(path) != before

    nasd_fs.mv(path, f"{scratch}/moved")
    assert not nasd_fs.exists(path) and nasd_fs.cat_file(f"{scratch}/moved") == b"9876543210"
    nasd_fs.makedirs(f"{scratch}/tree/a/b")
    nasd_fs.pipe_file(f"{scratch}/tree/a/b/leaf", b"leaf")
    nasd_fs.mv(f"{scratch}/tree", f"{scratch}/renamed", recursive=True)
    assert nasd_fs.cat_file(f"{scratch}/renamed/a/b/leaf") == b"leaf"
    nasd_fs.mkdir(f"{scratch}/into")
    nasd_fs.mv(f"{scratch}/moved", f"{scratch}/into")
    assert nasd_fs.cat_file(f"{scratch}/into/moved") == b"9876543210"
    nasd_fs.touch(f"{scratch}/into/moved", truncate=False)
    assert nasd_fs.cat_file(f"{scratch}/into/moved") == b"9876543210"


def test_large_files_go_up_down_and_across(nasd_fs, scratch, tmp_path):
    seed = int.from_bytes(os.urandom(4), "big")
    print(f"seed {seed}")
    data = random.Random(seed).randbytes(20 * 1024 * 1024 + 12345)
    local = tmp_path / "big"
    local.write_bytes(data)
    nasd_fs.put(str(local), f"{scratch}/big")
    nasd_fs.cp(f"{scratch}/big", f"{scratch}/copy")
    nasd_fs.get(f"{scratch}/copy", str(tmp_path / "back"))
    assert (tmp_path / "back").read_bytes() == data
    assert nasd_fs.cat_file(f"{scratch}/big", start=9_000_000, end=9_000_100) == data[9_000_000:9_000_100]
    with nasd_fs.open(f"{scratch}/copy", "rb") as f:
        assert f.read() == data
    assert [p.name for p in tmp_path.iterdir()] != [] and not any(
        p.name.endswith(nasd._nasd.TEMPORARY_SUFFIX) for p in tmp_path.iterdir()
    )


def test_one_client_serves_many_threads(nasd_fs, scratch):
    seed = int.from_bytes(os.urandom(4), "big")
    print(f"seed {seed}")
    rng = random.Random(seed)
    contents = {f"{scratch}/f{i}": rng.randbytes(rng.randrange(1, 300_000)) for i in range(24)}
    jobs = list(contents.items())
    rng.shuffle(jobs)
    barrier = threading.Barrier(8)

    def write(job):
        path, data = job
        if jobs.index(job) < 8:
            barrier.wait()  # the first eight start together
        nasd_fs.pipe_file(path, data)
        return path

    with ThreadPoolExecutor(8) as pool:
        written = list(pool.map(write, jobs))
    assert sorted(written) == sorted(contents)
    reads = [p for p in contents for _ in range(2)]
    rng.shuffle(reads)
    with ThreadPoolExecutor(8) as pool:
        for path, data in zip(reads, pool.map(nasd_fs.cat_file, reads)):
            assert data == contents[path], path


def test_an_append_appears_whole_at_close(nasd_fs, scratch):
    seed = int.from_bytes(os.urandom(4), "big")
    print(f"seed {seed}")
    rng = random.Random(seed)
    path = f"{scratch}/log"
    head = rng.randbytes(rng.randrange(1, 200_000))
    nasd_fs.pipe_file(path, head)
    block = 64 * 1024
    tail = rng.randbytes(rng.randrange(block, 5 * block))
    with nasd_fs.open(path, "ab", block_size=block) as f:
        assert f.tell() == len(head)
        for at in range(0, len(tail), 10_000):
            f.write(tail[at : at + 10_000])
        assert nasd_fs.cat_file(path) == head, "nothing appended is seen before close"
    assert nasd_fs.cat_file(path) == head + tail
    assert nasd_fs.ls(scratch, detail=False) == [path]

    with nasd_fs.open(f"{scratch}/new", "ab") as f:
        f.write(b"created by an append")
    assert nasd_fs.cat_file(f"{scratch}/new") == b"created by an append"

    with pytest.raises(RuntimeError):
        with nasd_fs.open(path, "ab") as f:
            f.write(b"never seen")
            raise RuntimeError("the appender failed")
    assert nasd_fs.cat_file(path) == head + tail
    with pytest.raises(IsADirectoryError):
        nasd_fs.open(scratch, "ab")
    assert sorted(nasd_fs.ls(scratch, detail=False)) == [path, f"{scratch}/new"]


def test_an_append_to_a_file_that_changed_meanwhile_is_refused_and_loses_the_change_of_no_one(nasd_fs, scratch):
    path = f"{scratch}/shared"
    nasd_fs.pipe_file(path, b"v1;")
    first = nasd_fs.open(path, "ab")
    second = nasd_fs.open(path, "ab")
    first.write(b"first;")
    second.write(b"second;")
    first.close()
    assert nasd_fs.cat_file(path) == b"v1;first;"
    with pytest.raises(BlockingIOError) as e:
        second.close()
    assert e.value.errno == errno.EAGAIN and "changed since it was opened for append" in str(e.value)
    assert nasd_fs.cat_file(path) == b"v1;first;"
    assert nasd_fs.ls(scratch, detail=False) == [path]

    late = nasd_fs.open(f"{scratch}/appeared", "ab")
    late.write(b"late")
    nasd_fs.pipe_file(f"{scratch}/appeared", b"someone else's")
    with pytest.raises(FileExistsError):
        late.close()
    assert nasd_fs.cat_file(f"{scratch}/appeared") == b"someone else's"


class NoBytesThroughPython:
    """The client with every call that hands file bytes to Python refused."""

    def __init__(self, client):
        self.client = client

    def __getattr__(self, name):
        if name in ("read", "open_read", "write", "open_write", "open_append"):
            raise AssertionError(f"cp_file called Client.{name}: bytes went through Python")
        return getattr(self.client, name)


def test_cp_file_copies_inside_the_native_client(nasd_fs, scratch):
    seed = int.from_bytes(os.urandom(4), "big")
    print(f"seed {seed}")
    data = random.Random(seed).randbytes(3 * 1024 * 1024 + 7)
    nasd_fs.pipe_file(f"{scratch}/src", data)
    fs = nasd.NasdFileSystem(client=NoBytesThroughPython(nasd_fs.client), skip_instance_cache=True)
    fs.cp_file(f"{scratch}/src", f"{scratch}/dst")
    assert nasd_fs.cat_file(f"{scratch}/dst") == data
    assert nasd_fs.info(f"{scratch}/dst")["ino"] != nasd_fs.info(f"{scratch}/src")["ino"]
    with pytest.raises(FileNotFoundError):
        fs.cp_file(f"{scratch}/missing", f"{scratch}/dst")
    assert nasd_fs.cat_file(f"{scratch}/dst") == data
