"""Reads, exports and their lifetimes, on whatever device there is: a GPU,
or gpq's CPU emulator (a build with ``--features emulator`` and
``GPQ_EMULATE=1``, which is how CI runs them). On the emulator the device
memory is host memory, so pyarrow and NumPy, real consumers nobody here
wrote, import the exports; on a GPU those checks are in ``test_cuda.py``."""

import ctypes
import gc
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import gpq
from arrow_c import ARROW_DEVICE_CPU, DEVICE_ARRAY_SIZE, SCHEMA_SIZE, DeviceStreamReader, StreamError, device_fields
from conftest import needs_device

_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]


def capsule_name(capsule) -> bytes:
    return _get_name(capsule)


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

pytestmark = needs_device

#: Whether the "device" memory is host memory (gpq's CPU emulator).
HOST_MEMORY = os.environ.get("GPQ_EMULATE") == "1"
host_memory = pytest.mark.skipif(not HOST_MEMORY, reason="pyarrow and NumPy import host memory only; on a GPU see test_cuda.py")


def test_read_matches_pyarrow(sample):
    table, path = sample
    t = gpq.read_parquet(path)
    assert len(t) == 5000 and t.num_columns == 7
    assert t.column_names == table.column_names
    assert t.to_arrow().equals(pq.read_table(path))
    assert t.to_arrow().schema.metadata == t.schema.to_pyarrow().metadata, "the file's key-value metadata comes along"
    stats = t.stats
    for key in ["io_path", "decompression", "plan_s", "page_headers_s", "decompress_s", "decode_s", "total_s", "summary"]:
        assert key in stats, key
    assert stats["total_s"] > 0 and stats["pages"] > 0
    assert t.device_bytes > 0
    # A selection: columns in the order asked, some row groups.
    s = gpq.read_parquet(path, columns=["name", "id"], row_groups=[2])
    assert s.column_names == ["name", "id"] and len(s) == 1000
    assert s.to_arrow().equals(pq.read_table(path, columns=["name", "id"]).slice(4000))
    assert s["id"].to_arrow().to_pylist() == list(range(4000, 5000))


def test_columns_by_name_and_position(sample):
    _, path = sample
    t = gpq.read_parquet(path)
    assert t["price"].name == "price" and t[2].name == "price" and t[-1].name == "tags"
    assert t.column("small").null_count == 500
    with pytest.raises(KeyError):
        t["nope"]
    with pytest.raises(IndexError):
        t[7]
    assert [c.name for c in t.columns] == t.column_names


@host_memory
def test_device_array_is_imported_by_pyarrow_without_a_copy(sample):
    table, path = sample
    t = gpq.read_parquet(path)
    batch = pa.record_batch(t)  # through __arrow_c_device_array__
    assert pa.Table.from_batches([batch]).equals(pq.read_table(path))
    # The same memory: pyarrow's buffers are gpq's.
    ids = batch.column(0).buffers()[1]
    assert ids.address == dict(t["id"].buffers())["values"].ptr
    names = batch.column(4).buffers()
    assert names[1].address == dict(t["name"].buffers())["offsets"].ptr
    # One column on its own.
    arr = pa.array(t["price"])
    assert arr.equals(table["price"].chunk(0))
    # The schema capsule is the device schema.
    assert pa.schema(t).names == t.column_names


@host_memory
def test_dlpack_hands_fixed_width_columns_to_numpy(sample):
    table, path = sample
    t = gpq.read_parquet(path)
    ids = np.from_dlpack(t["id"])
    assert ids.dtype == np.int64 and ids.tolist() == list(range(5000))
    assert ids.ctypes.data == dict(t["id"].buffers())["values"].ptr, "no copy"
    days = np.from_dlpack(t["day"])
    assert days.dtype == np.int32
    assert days.tolist() == table["day"].cast(pa.int32()).to_pylist()
    prices = np.from_dlpack(t["price"])
    assert np.array_equal(prices, np.arange(5000) / 8)
    assert t["id"].__dlpack_device__() == (1, 0)
    # No tensor for nulls, decimals or strings: a BufferError naming why.
    with pytest.raises(gpq.ExportError, match="nulls"):
        np.from_dlpack(t["small"])
    with pytest.raises(BufferError, match="Decimal128"):
        t["amount"].__dlpack__()
    with pytest.raises(gpq.ExportError):
        t["name"].__dlpack__()
    with pytest.raises(gpq.ExportError, match="copy"):
        t["id"].__dlpack__(copy=True)
    # ...but their buffers are tensors.
    bufs = dict(t["small"].buffers())
    bits = np.unpackbits(np.from_dlpack(bufs["validity"]), bitorder="little")[:5000]
    assert bits.tolist() == [0 if i % 10 == 3 else 1 for i in range(5000)]
    offsets = np.from_dlpack(dict(t["name"].buffers())["offsets"])
    assert offsets.dtype == np.int32 and len(offsets) == 5001
    # Capsules of both protocols: pre-1.0 unless the consumer asks for 1.x.
    assert capsule_name(t["id"].__dlpack__()) == b"dltensor"
    versioned = t["id"].__dlpack__(max_version=(1, 0))
    assert capsule_name(versioned) == b"dltensor_versioned"
    # DLManagedTensorVersioned starts with its version: never newer than asked.
    version = (ctypes.c_uint32 * 2).from_address(_get_pointer(versioned, b"dltensor_versioned"))
    assert tuple(version) == (1, 0)
    assert tuple((ctypes.c_uint32 * 2).from_address(_get_pointer(t["id"].__dlpack__(max_version=(1, 5)), b"dltensor_versioned"))) == (1, 1)
    # No CUDA Array Interface for host memory.
    assert not hasattr(t["id"], "__cuda_array_interface__")


@host_memory
def test_device_stream_is_read_batch_by_batch(parts):
    want, d = parts
    reader = gpq.read_parquet_batches(d, batch_rows=1000)
    consumer = DeviceStreamReader(reader.__arrow_c_device_stream__())
    assert consumer.device_type == ARROW_DEVICE_CPU
    schema_buf = ctypes.create_string_buffer(SCHEMA_SIZE)
    consumer.schema_into(schema_buf)
    schema = pa.Schema._import_from_c(ctypes.addressof(schema_buf))
    rows, batches = [], []
    buf = ctypes.create_string_buffer(DEVICE_ARRAY_SIZE)
    while consumer.next_into(buf):
        assert device_fields(buf)[0] == ARROW_DEVICE_CPU
        b = pa.RecordBatch._import_from_c_device(ctypes.addressof(buf), schema)
        rows.append(b.num_rows)
        batches.append(b)
    assert rows == [700, 1, 1000, 1000, 500, 1000, 200]
    assert pa.Table.from_batches(batches).to_pylist() == want.to_pylist()
    assert not consumer.next_into(buf), "the end stays the end"
    # The reader was handed over.
    with pytest.raises(gpq.ExportError):
        reader.__arrow_c_device_stream__()
    assert list(reader) == []


def test_batches_iterate_as_tables(parts):
    want, d = parts
    reader = gpq.read_parquet_batches(d, batch_rows=1000)
    assert reader.schema.names == want.column_names
    tables = list(reader)
    assert [len(t) for t in tables] == [700, 1, 1000, 1000, 500, 1000, 200]
    got = pa.concat_tables([t.to_arrow() for t in tables])
    assert got.to_pylist() == want.to_pylist()
    limited = list(gpq.read_parquet_batches(sorted(d.iterdir()), limit=1800, columns=["id"]))
    assert sum(len(t) for t in limited) == 1800


def test_a_corrupt_file_is_a_typed_error_and_ends_the_stream(parts, tmp_path):
    _, d = parts
    for i, f in enumerate(sorted(d.iterdir())):
        data = bytearray(f.read_bytes())
        if i == 2:
            md = pq.ParquetFile(f).metadata
            start = md.row_group(1).column(0).data_page_offset
            data[start : start + 24] = b"\xff" * 24
        (tmp_path / f.name).write_bytes(bytes(data))
    reader = gpq.read_parquet_batches(tmp_path, batch_rows=1000)
    assert [len(next(reader)) for _ in range(2)] == [700, 1]
    with pytest.raises(gpq.CorruptFileError, match="part-2.parquet") as e:
        next(reader)
    assert e.value.kind == "corrupt-page" and "row group" in str(e.value)
    assert list(reader) == []
    # The same through the device stream: the error code, then the same error again.
    consumer = DeviceStreamReader(gpq.read_parquet_batches(tmp_path, batch_rows=1000).__arrow_c_device_stream__())
    buf = ctypes.create_string_buffer(DEVICE_ARRAY_SIZE)
    assert consumer.next_into(buf) and consumer.next_into(buf)
    with pytest.raises(StreamError) as first:
        consumer.next_into(buf)
    assert first.value.code == 5 and "part-2.parquet" in first.value.message
    with pytest.raises(StreamError) as again:
        consumer.next_into(buf)
    assert again.value.code == first.value.code
    # The next file reads fine in the same process.
    assert len(gpq.read_parquet(sorted(d.iterdir())[3])) == 1200


def test_memory_is_freed_when_the_last_holder_lets_go(sample):
    _, path = sample
    gpq.read_parquet(path)  # whatever the device keeps between reads
    gc.collect()
    before = gpq.live_device_bytes()
    t = gpq.read_parquet(path)
    held = gpq.live_device_bytes() - before
    assert held >= t.device_bytes
    col = t["id"]
    schema_capsule, array_capsule = t.__arrow_c_device_array__()
    dl = t["price"].__dlpack__()
    del t
    gc.collect()
    assert gpq.live_device_bytes() - before == held, "a column, an export and a DLPack capsule still hold the table"
    del col, schema_capsule, array_capsule
    gc.collect()
    assert gpq.live_device_bytes() - before == held, "the DLPack capsule still holds it"
    del dl
    gc.collect()
    assert gpq.live_device_bytes() == before, "unconsumed capsules release what they hold"
    if not HOST_MEMORY:
        return
    # A consumer that imported the export holds the memory until it lets go.
    t = gpq.read_parquet(path)
    batch = pa.record_batch(t)
    ids = np.from_dlpack(t["id"])
    del t
    gc.collect()
    assert gpq.live_device_bytes() - before == held
    del batch
    gc.collect()
    assert gpq.live_device_bytes() - before == held, "NumPy's array still holds it"
    del ids
    gc.collect()
    assert gpq.live_device_bytes() == before
