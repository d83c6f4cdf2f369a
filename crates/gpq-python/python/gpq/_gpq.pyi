"""Type stubs of gpq's extension module (re-exported by ``gpq``)."""

import os
from typing import Any, Iterator, Mapping, Optional, Sequence, Tuple, Union

_Path = Union[str, "os.PathLike[str]"]

__version__: str

def read_parquet(
    path: _Path,
    columns: Optional[Sequence[str]] = None,
    row_groups: Optional[Sequence[int]] = None,
    *,
    device: int = 0,
    io: str = "auto",
    decompress: str = "auto",
    io_threads: Optional[int] = None,
    memory_limit: Optional[int] = None,
    verify_checksums: bool = False,
) -> "Table":
    """Reads a Parquet file into GPU memory, without the GIL.

    ``columns`` are names or dotted leaf paths, in the order wanted;
    ``row_groups`` are indices. ``io`` is ``"auto"``, ``"gds"``,
    ``"cufile-compat"`` or ``"bounce"``; ``decompress`` is ``"auto"``,
    ``"nvcomp"`` or ``"cpu"``; ``memory_limit`` bounds the device memory of
    the read (bytes). Raises a :class:`gpq.GpqError` subclass naming file,
    row group, column and page on bad input.
    """

def read_parquet_batches(
    paths: Union[_Path, Sequence[_Path]],
    columns: Optional[Sequence[str]] = None,
    row_groups: Optional[Sequence[int]] = None,
    *,
    batch_rows: Optional[int] = None,
    memory_limit: Optional[int] = None,
    limit: Optional[int] = None,
    decode_ahead: Optional[int] = None,
    device: int = 0,
    io: str = "auto",
    decompress: str = "auto",
    io_threads: Optional[int] = None,
    verify_checksums: bool = False,
) -> "BatchReader":
    """Reads one file, a list of files or a directory's Parquet files as a
    sequence of device tables of at most ``batch_rows`` rows (whole row
    groups) and within ``memory_limit`` bytes of device memory, ``limit``
    rows in all. ``decode_ahead`` passes are read and decoded at once
    (default: as many as a quarter of the free device memory holds, at most
    16; under ``memory_limit``, 4, which share the limit)."""

def read_schema(path: _Path, columns: Optional[Sequence[str]] = None) -> "Schema":
    """The schema a read of ``path`` (these columns) returns; needs no GPU."""

def device_available() -> bool:
    """Whether a CUDA device (or gpq's CPU emulator, in builds with it and
    ``GPQ_EMULATE=1``) can be used."""

def live_device_bytes(device: int = 0) -> int:
    """Bytes of gpq's device buffers alive now on ``device``: tables, and
    exports their consumers have not released."""

def clear_footer_cache() -> None:
    """Forgets the decoded footers kept for the next read of a file."""

class Schema:
    """An Arrow schema; ``pyarrow.schema(s)`` or ``s.to_pyarrow()`` converts it."""

    @property
    def names(self) -> list[str]: ...
    @property
    def types(self) -> list[str]:
        """Arrow types of the fields, as text."""
    def __len__(self) -> int: ...
    def __arrow_c_schema__(self) -> object: ...
    def to_pyarrow(self) -> Any:
        """The schema as a ``pyarrow.Schema`` (needs pyarrow)."""

class Buffer:
    """One Arrow buffer of a column in device memory, as a 1-D tensor."""

    @property
    def kind(self) -> str:
        """``"validity"``, ``"offsets"``, ``"values"`` or ``"view_data"``."""
    @property
    def ptr(self) -> int: ...
    @property
    def size(self) -> int:
        """Bytes."""
    @property
    def dtype(self) -> str:
        """Element type as the CUDA Array Interface writes it (``"|u1"``, ``"<i8"``)."""
    def __len__(self) -> int: ...
    def __dlpack__(
        self,
        *,
        stream: Optional[int] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> object: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    @property
    def __cuda_array_interface__(self) -> Mapping[str, Any]: ...

class Column:
    """One column of a device table."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str:
        """Arrow type of the result (of ``to_arrow()``)."""
    @property
    def device_type(self) -> str:
        """Arrow type of the device buffers (of the device export)."""
    @property
    def null_count(self) -> int: ...
    @property
    def offset(self) -> int: ...
    def __len__(self) -> int: ...
    def buffers(self) -> list[Tuple[str, Buffer]]:
        """The Arrow buffers the column has, by name."""
    def __dlpack__(
        self,
        *,
        stream: Optional[int] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> object:
        """DLPack of the values: fixed-width numbers without nulls only
        (otherwise :class:`gpq.ExportError`)."""
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    @property
    def __cuda_array_interface__(self) -> Mapping[str, Any]: ...
    def __arrow_c_schema__(self) -> object: ...
    def __arrow_c_device_array__(self, requested_schema: Optional[object] = None, **kwargs: Any) -> Tuple[object, object]: ...
    def to_arrow(self) -> Any:
        """A host copy as a ``pyarrow.Array``."""

class Table:
    """A table in GPU memory."""

    @property
    def num_rows(self) -> int: ...
    @property
    def num_columns(self) -> int: ...
    @property
    def column_names(self) -> list[str]: ...
    @property
    def schema(self) -> Schema:
        """The result schema (of ``to_arrow()``)."""
    @property
    def device_schema(self) -> Schema:
        """The schema of the device buffers (of the device export)."""
    @property
    def stats(self) -> dict[str, Any]:
        """IO path, decompression path, per-stage seconds, bytes, and a one-line ``summary``."""
    @property
    def device_bytes(self) -> int: ...
    @property
    def columns(self) -> list[Column]: ...
    def column(self, key: Union[str, int]) -> Column: ...
    def __getitem__(self, key: Union[str, int]) -> Column: ...
    def __len__(self) -> int: ...
    def __arrow_c_schema__(self) -> object: ...
    def __arrow_c_device_array__(self, requested_schema: Optional[object] = None, **kwargs: Any) -> Tuple[object, object]: ...
    def __arrow_c_device_stream__(self, requested_schema: Optional[object] = None, **kwargs: Any) -> object: ...
    def to_arrow(self) -> Any:
        """A host copy as a ``pyarrow.Table``."""

class BatchReader:
    """Device tables, one per pass; iterate it, or hand it over as an Arrow device stream."""

    @property
    def schema(self) -> Schema: ...
    def __iter__(self) -> Iterator[Table]: ...
    def __next__(self) -> Table: ...
    def __arrow_c_device_stream__(self, requested_schema: Optional[object] = None, **kwargs: Any) -> object: ...
