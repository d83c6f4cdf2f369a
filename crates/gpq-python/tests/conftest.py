"""Shared fixtures: small Parquet files written by pyarrow (another writer
than gpq's tests in Rust use), and whether a device (a GPU, or gpq's CPU
emulator) is there to read them onto."""

import datetime
import decimal
import os

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import gpq  # noqa: E402


def _sample_table(rows: int) -> "pa.Table":
    return pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "small": pa.array([None if i % 10 == 3 else i % 1000 for i in range(rows)], pa.int32()),
            "price": pa.array([i / 8 for i in range(rows)], pa.float64()),
            "day": pa.array([datetime.date(2020, 1, 1) + datetime.timedelta(days=i % 400) for i in range(rows)], pa.date32()),
            "name": pa.array([f"name-{i}-" + "x" * (i % 17) for i in range(rows)], pa.string()),
            "amount": pa.array([decimal.Decimal(i) / 100 for i in range(rows)], pa.decimal128(15, 2)),
            "tags": pa.array([None if i % 9 == 0 else [i, i + 1][: i % 3] for i in range(rows)], pa.list_(pa.int32())),
        }
    )


@pytest.fixture(scope="session")
def sample(tmp_path_factory):
    """A 5,000-row file in 3 row groups (SNAPPY): the table and its path."""
    table = _sample_table(5000)
    path = tmp_path_factory.mktemp("data") / "sample.parquet"
    pq.write_table(table, path, row_group_size=2000, compression="snappy")
    return table, path


@pytest.fixture(scope="session")
def parts(tmp_path_factory):
    """A directory of four files (700, 1, 2500 and 1200 rows, ZSTD)."""
    d = tmp_path_factory.mktemp("parts")
    tables = []
    for i, rows in enumerate([700, 1, 2500, 1200]):
        t = _sample_table(rows)
        pq.write_table(t, d / f"part-{i}.parquet", row_group_size=500, compression="zstd")
        tables.append(t)
    return pa.concat_tables(tables), d


def has_device() -> bool:
    return gpq.device_available()


needs_device = pytest.mark.skipif(
    not gpq.device_available(),
    reason="no CUDA device and no CPU emulator (build with --features emulator and set GPQ_EMULATE=1)",
)

on_emulator = os.environ.get("GPQ_EMULATE") == "1"
