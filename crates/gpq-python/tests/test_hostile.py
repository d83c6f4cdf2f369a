"""Hostile input through Python: every file of the regression corpus
(``testdata/regressions``: inputs that once faulted the GPU, hung or read
wrong values) raises a ``gpq.GpqError`` subclass naming the file, never
another exception or a crash, and a good file reads right after each. Also
truncated and bit-flipped copies of a good file. On the emulator in CI, on
the GPU in the device stage."""

import pathlib
import random

import pyarrow.parquet as pq
import pytest

import gpq
from conftest import needs_device

pytestmark = needs_device

CORPUS = pathlib.Path(__file__).resolve().parents[3] / "testdata" / "regressions"


def corpus():
    files = sorted(CORPUS.glob("*.parquet")) if CORPUS.is_dir() else []
    if not files:
        pytest.skip(f"no regression corpus at {CORPUS}")
    return files


@pytest.mark.parametrize("name", [p.name for p in sorted(CORPUS.glob("*.parquet"))] or ["(none)"])
def test_regression_files_raise_typed_errors(name, sample):
    files = {p.name: p for p in corpus()}
    path = files[name]
    with pytest.raises(gpq.GpqError) as e:
        gpq.read_parquet(path).to_arrow()
    assert name in str(e.value), str(e.value)
    assert e.value.kind in {"corrupt-page", "metadata", "truncated", "not-parquet"}, e.value.kind
    # The process reads the next file as if nothing happened.
    table, good = sample
    assert gpq.read_parquet(good).to_arrow().equals(pq.read_table(good))


def test_damaged_copies_never_escape_as_other_exceptions(sample, tmp_path):
    table, good = sample
    data = good.read_bytes()
    rng = random.Random(7)
    outcomes = {"read": 0, "error": 0}
    for i in range(40):
        b = bytearray(data)
        if i % 4 == 0:
            b = b[: rng.randrange(len(b))]
        else:
            for _ in range(1 + i % 5):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        p = tmp_path / f"damaged-{i}.parquet"
        p.write_bytes(bytes(b))
        try:
            got = gpq.read_parquet(p).to_arrow()
        except gpq.GpqError as e:
            assert e.kind != "internal", f"{p.name}: {e}"
            outcomes["error"] += 1
            continue
        # Read without complaint: a flip in bytes no decoder checks (values,
        # statistics), so the shape is still the file's.
        assert got.num_rows == table.num_rows and got.column_names == table.column_names
        outcomes["read"] += 1
    assert outcomes["error"] > 0, outcomes
    assert gpq.read_parquet(good).to_arrow().equals(pq.read_table(good))
