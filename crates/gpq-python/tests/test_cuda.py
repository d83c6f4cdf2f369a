"""On a CUDA device, with consumers nobody here wrote: CuPy and PyTorch take
columns through DLPack and the CUDA Array Interface at gpq's own device
addresses; nanoarrow's device module imports the Arrow device export; the
device stream is read batch by batch; releases give the memory back.

The data is TPC-H lineitem when ``GPQ_LINEITEM`` names a file (the device
script generates one), else a pyarrow-written sample. Skipped without a
CUDA device (on the CPU emulator, ``test_read.py`` covers the same ground
with host consumers)."""

import ctypes
import gc
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import gpq
from arrow_c import ARROW_DEVICE_CUDA, DEVICE_ARRAY_SIZE, DeviceStreamReader, device_fields, release_array

pytestmark = pytest.mark.skipif(
    os.environ.get("GPQ_EMULATE") == "1" or not gpq.device_available(), reason="needs a CUDA device"
)


@pytest.fixture(scope="module")
def lineitem(tmp_path_factory):
    path = os.environ.get("GPQ_LINEITEM")
    if path:
        return path
    import datetime

    rows = 200_000
    t = pa.table(
        {
            "l_orderkey": pa.array(range(rows), pa.int64()),
            "l_shipdate": pa.array([datetime.date(1992, 1, 2) + datetime.timedelta(days=i % 2500) for i in range(rows)], pa.date32()),
            "l_comment": pa.array([f"comment {i}" for i in range(rows)]),
        }
    )
    p = tmp_path_factory.mktemp("lineitem") / "lineitem.parquet"
    pq.write_table(t, p, row_group_size=50_000)
    return str(p)


def expected(path, column, cast=None):
    a = pq.read_table(path, columns=[column]).column(0)
    return (a.cast(cast) if cast else a).to_numpy()


def test_torch_takes_integer_columns_without_a_copy(lineitem):
    torch = pytest.importorskip("torch")
    import numpy as np

    t = gpq.read_parquet(lineitem, columns=["l_orderkey", "l_shipdate"])
    keys = torch.from_dlpack(t["l_orderkey"])
    assert keys.is_cuda and keys.dtype == torch.int64 and keys.device.index == 0
    assert keys.data_ptr() == dict(t["l_orderkey"].buffers())["values"].ptr, "no copy"
    assert np.array_equal(keys.cpu().numpy(), expected(lineitem, "l_orderkey"))
    days = torch.from_dlpack(t["l_shipdate"])
    assert days.dtype == torch.int32
    assert days.data_ptr() == dict(t["l_shipdate"].buffers())["values"].ptr
    assert np.array_equal(days.cpu().numpy(), expected(lineitem, "l_shipdate", pa.int32()))
    # Work on the tensor after the table is gone from Python.
    del t
    gc.collect()
    assert int(keys.max().item()) == int(expected(lineitem, "l_orderkey").max())


def test_cupy_takes_columns_and_buffers(lineitem):
    cp = pytest.importorskip("cupy")
    import numpy as np

    t = gpq.read_parquet(lineitem, columns=["l_orderkey", "l_shipdate", "l_comment"])
    keys = cp.from_dlpack(t["l_orderkey"])
    assert keys.data.ptr == dict(t["l_orderkey"].buffers())["values"].ptr
    assert np.array_equal(cp.asnumpy(keys), expected(lineitem, "l_orderkey"))
    # The CUDA Array Interface: the same memory.
    cai = t["l_shipdate"].__cuda_array_interface__
    assert cai["typestr"] == "<i4" and cai["shape"] == (len(t),)
    days = cp.asarray(t["l_shipdate"])
    assert days.data.ptr == cai["data"][0]
    assert np.array_equal(cp.asnumpy(days), expected(lineitem, "l_shipdate", pa.int32()))
    # A string column's buffers: offsets (or views) and characters as byte tensors.
    bufs = dict(t["l_comment"].buffers())
    views = t["l_comment"].device_type in ("Utf8View", "BinaryView")
    assert set(bufs) == ({"values", "view_data"} if views else {"offsets", "values"}), (t["l_comment"].device_type, set(bufs))
    for b in bufs.values():
        arr = cp.from_dlpack(b)
        assert arr.data.ptr == b.ptr and arr.size == len(b)


def test_nanoarrow_imports_the_device_export(lineitem):
    nd = pytest.importorskip("nanoarrow.device")
    t = gpq.read_parquet(lineitem, columns=["l_orderkey", "l_shipdate"])
    arr = nd.c_device_array(t)
    assert arr.device_type_id == ARROW_DEVICE_CUDA and arr.device_id == 0
    c = arr.array
    assert c.length == len(t) and c.n_children == 2
    # nanoarrow sees CUDA buffers at gpq's addresses.
    key_buffers = c.child(0).buffers
    assert dict(t["l_orderkey"].buffers())["values"].ptr in key_buffers
    col = nd.c_device_array(t["l_shipdate"])
    assert dict(t["l_shipdate"].buffers())["values"].ptr in col.array.buffers


def test_device_stream_batch_by_batch(lineitem):
    cp = pytest.importorskip("cupy")
    total = pq.ParquetFile(lineitem).metadata.num_rows
    reader = gpq.read_parquet_batches(lineitem, columns=["l_orderkey"], batch_rows=max(1, total // 4))
    consumer = DeviceStreamReader(reader.__arrow_c_device_stream__())
    assert consumer.device_type == ARROW_DEVICE_CUDA
    buf = ctypes.create_string_buffer(DEVICE_ARRAY_SIZE)
    rows = 0
    batches = 0
    while consumer.next_into(buf):
        device_type, device_id, sync_event = device_fields(buf)
        assert (device_type, device_id) == (ARROW_DEVICE_CUDA, 0)
        assert sync_event, "a CUDA event to wait on"
        event = ctypes.c_void_p.from_address(sync_event).value
        cp.cuda.runtime.eventSynchronize(event)
        rows += ctypes.c_int64.from_buffer(buf, 0).value
        batches += 1
    assert rows == total and batches >= 2
    release_array(buf)


def test_released_exports_give_device_memory_back(lineitem):
    torch = pytest.importorskip("torch")
    gpq.read_parquet(lineitem, columns=["l_orderkey"])
    gc.collect()
    before = gpq.live_device_bytes()
    t = gpq.read_parquet(lineitem, columns=["l_orderkey"])
    held = gpq.live_device_bytes() - before
    assert held >= t.device_bytes > 0
    keys = torch.from_dlpack(t["l_orderkey"])
    del t
    gc.collect()
    assert gpq.live_device_bytes() - before == held, "torch's tensor holds the table"
    del keys
    gc.collect()
    torch.cuda.synchronize()
    assert gpq.live_device_bytes() == before, "released when torch lets go"
