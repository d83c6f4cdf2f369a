"""What works without a GPU: the package imports, schemas are read on the
CPU, bad input raises the right exception with the library's message, and a
read without a device is a clean ``NoDeviceError``."""

import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import gpq


def test_package_surface():
    assert gpq.__version__
    for name in ["read_parquet", "read_parquet_batches", "read_schema", "Table", "Column", "Buffer", "Schema", "BatchReader"]:
        assert hasattr(gpq, name), name
    # Every exception is a GpqError, and the built-in one a user would catch.
    assert issubclass(gpq.FileError, OSError) and issubclass(gpq.FileError, gpq.GpqError)
    assert issubclass(gpq.ColumnNotFoundError, KeyError)
    assert issubclass(gpq.OutOfMemoryError, MemoryError)
    assert issubclass(gpq.ExportError, BufferError)
    assert issubclass(gpq.InvalidArgumentError, ValueError)


def test_schema_is_read_on_the_cpu(sample):
    table, path = sample
    s = gpq.read_schema(path)
    assert s.names == table.column_names
    assert len(s) == 7
    # The PyCapsule schema goes to pyarrow as the same schema pyarrow reads.
    assert pa.schema(s).equals(pq.read_schema(path), check_metadata=False)
    assert s.to_pyarrow().names == table.column_names
    sel = gpq.read_schema(path, columns=["price", "id"])
    assert sel.names == ["price", "id"]
    assert sel.types == ["Float64", "Int64"]


def test_errors_carry_the_library_message(sample, tmp_path):
    _, path = sample
    with pytest.raises(gpq.FileError) as e:
        gpq.read_schema(tmp_path / "missing.parquet")
    assert "missing.parquet" in str(e.value) and e.value.kind == "open"
    assert isinstance(e.value, OSError)
    not_parquet = tmp_path / "not.parquet"
    not_parquet.write_bytes(b"this is not a parquet file at all, just text" * 10)
    with pytest.raises(gpq.CorruptFileError) as e:
        gpq.read_schema(not_parquet)
    assert "not.parquet" in str(e.value)
    with pytest.raises(gpq.ColumnNotFoundError) as e:
        gpq.read_schema(path, columns=["nope"])
    assert "nope" in str(e.value) and isinstance(e.value, KeyError)
    # A truncated footer.
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(gpq.CorruptFileError):
        gpq.read_schema(cut)


def test_bad_options_are_invalid_arguments(sample):
    _, path = sample
    with pytest.raises(gpq.InvalidArgumentError, match="IO path"):
        gpq.read_parquet(path, io="teleport")
    with pytest.raises(gpq.InvalidArgumentError, match="decompression"):
        gpq.read_parquet(path, decompress="magic")
    with pytest.raises(gpq.InvalidArgumentError):
        gpq.read_parquet_batches([])


def test_without_a_device_reads_raise_no_device_error(sample):
    """In a fresh process with no emulator asked for: a clean NoDeviceError
    where there is no GPU (on a GPU machine the read just works)."""
    _, path = sample
    code = textwrap.dedent(
        f"""
        import gpq
        try:
            t = gpq.read_parquet({str(path)!r})
            print("read", len(t))
        except gpq.NoDeviceError as e:
            assert e.kind == "no-cuda-device", e.kind
            assert isinstance(e, gpq.GpqError)
            print("no-device", e)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "GPQ_EMULATE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("no-device"):
        assert "no CUDA device" in out.stdout
        assert subprocess.run(
            [sys.executable, "-c", "import gpq; assert not gpq.device_available()"], env=env, timeout=60
        ).returncode == 0
    else:
        assert out.stdout.strip() == "read 5000"
