"""pandas and pyarrow at nasd:// URLs: Parquet and CSV round trips, and a
Parquet dataset of several files read with column projection, which reads
only the byte ranges of the columns asked for — counted at the drives, from
their audit trails."""

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import nasd

#: Bytes at the head of each file the manager keeps, not the drives (`nasd up`'s default
#: small-file threshold, nasd_manager::SMALL_FILE_THRESHOLD_DEFAULT).
SMALL_FILE_THRESHOLD = 64 * 1024


@pytest.fixture
def options(cluster):
    return {"config": str(cluster.config)}


def frame(rows: int, seed: int) -> pd.DataFrame:
    print(f"frame seed {seed}")
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "id": np.arange(rows, dtype=np.int64),
            "value": rng.standard_normal(rows),
            "label": rng.choice(["red", "green", "blue"], rows),
            "blob": [rng.bytes(64).hex() for _ in range(rows)],
        }
    )


def test_pandas_round_trips_parquet_and_csv(scratch, options):
    df = frame(5000, seed=27)
    df.to_parquet(f"nasd://{scratch}/table.parquet", storage_options=options)
    back = pd.read_parquet(f"nasd://{scratch}/table.parquet", storage_options=options)
    pd.testing.assert_frame_equal(back, df)

    df.to_csv(f"nasd://{scratch}/table.csv", index=False, storage_options=options)
    back = pd.read_csv(f"nasd://{scratch}/table.csv", storage_options=options)
    pd.testing.assert_frame_equal(back, df)


def test_pyarrow_reads_a_dataset_of_several_files_with_column_projection(scratch, nasd_fs, cluster):
    parts = [frame(20000, seed=100 + i) for i in range(4)]
    for i, part in enumerate(parts):
        with nasd_fs.open(f"{scratch}/data/part-{i}.parquet", "wb") as f:
            pq.write_table(pa_table(part), f, row_group_size=5000)
    files = nasd_fs.find(f"{scratch}/data")
    total = sum(nasd_fs.size(p) for p in files)

    # The count the drives keep sees a whole read: every byte of every file but its head, which
    # the manager keeps (files below the small-file threshold live in its metadata store).
    since = cluster.audit_marks()
    for p in files:
        nasd_fs.cat_file(p)
    whole = cluster.bytes_read_at_drives(since)
    heads = sum(min(nasd_fs.size(p), SMALL_FILE_THRESHOLD) for p in files)
    assert whole >= total - heads, (whole, total, heads)

    fs = nasd.NasdFileSystem(client=nasd_fs.client, default_cache_type="none", skip_instance_cache=True)
    since = cluster.audit_marks()
    dataset = ds.dataset(f"{scratch}/data", format="parquet", filesystem=fs)
    table = dataset.to_table(columns=["id", "value"])
    projected = cluster.bytes_read_at_drives(since)

    expected = pd.concat(parts, ignore_index=True)[["id", "value"]]
    got = table.to_pandas().sort_values(["id", "value"], ignore_index=True)
    pd.testing.assert_frame_equal(got, expected.sort_values(["id", "value"], ignore_index=True))
    assert len(dataset.files) == 4
    # The wide `blob` and `label` columns were not fetched: the drives served a part of the files.
    print(f"read at the drives: projection {projected} bytes, whole files {whole}, dataset {total}")
    assert 0 < projected < total / 2, (projected, total)


def pa_table(df):
    import pyarrow as pa

    return pa.Table.from_pandas(df, preserve_index=False)
