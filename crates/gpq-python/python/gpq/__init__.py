"""gpq: read Apache Parquet straight into GPU memory.

>>> import gpq
>>> t = gpq.read_parquet("lineitem.parquet", columns=["l_orderkey", "l_shipdate"])
>>> t.stats["summary"]                       # IO path, decompression, per-stage times
>>> import torch; torch.from_dlpack(t["l_orderkey"])   # no copy
>>> t.to_arrow()                             # a host copy, as a pyarrow.Table

Tables, columns and batch readers implement the Arrow PyCapsule interface
(``__arrow_c_device_array__``, ``__arrow_c_device_stream__``,
``__arrow_c_schema__``); fixed-width columns without nulls, and every
column's buffers, implement DLPack (``__dlpack__``) and the CUDA Array
Interface. Device memory stays alive while any table, column, buffer or
consumer of an export holds it.
"""

from . import errors
from ._gpq import (
    BatchReader,
    Buffer,
    Column,
    Schema,
    Table,
    __version__,
    clear_footer_cache,
    device_available,
    live_device_bytes,
    read_parquet,
    read_parquet_batches,
    read_schema,
)
from .errors import (
    ColumnNotFoundError,
    CorruptFileError,
    DeviceError,
    ExportError,
    FileError,
    GpqError,
    InvalidArgumentError,
    NoDeviceError,
    OutOfMemoryError,
    SchemaMismatchError,
    UnsupportedError,
)

__all__ = [
    "BatchReader",
    "Buffer",
    "Column",
    "Schema",
    "Table",
    "__version__",
    "clear_footer_cache",
    "device_available",
    "errors",
    "live_device_bytes",
    "read_parquet",
    "read_parquet_batches",
    "read_schema",
    "ColumnNotFoundError",
    "CorruptFileError",
    "DeviceError",
    "ExportError",
    "FileError",
    "GpqError",
    "InvalidArgumentError",
    "NoDeviceError",
    "OutOfMemoryError",
    "SchemaMismatchError",
    "UnsupportedError",
]
