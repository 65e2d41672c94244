"""fsspec's own abstract test suite (copy, get, put, pipe, open) against a live `nasd up`."""

import posixpath
import uuid

import fsspec.tests.abstract as abstract
import pytest


class NasdFixtures(abstract.AbstractFixtures):
    @pytest.fixture
    def fs(self, nasd_fs):
        return nasd_fs

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def fs_path(self, nasd_fs):
        path = f"/abstract-{uuid.uuid4().hex[:12]}"
        nasd_fs.mkdir(path)
        yield path
        nasd_fs.rm(path, recursive=True)


class TestNasdCopy(abstract.AbstractCopyTests, NasdFixtures):
    pass


class TestNasdGet(abstract.AbstractGetTests, NasdFixtures):
    pass


class TestNasdPut(abstract.AbstractPutTests, NasdFixtures):
    pass


class TestNasdPipe(abstract.AbstractPipeTests, NasdFixtures):
    pass


class TestNasdOpen(abstract.AbstractOpenTests, NasdFixtures):
    pass
