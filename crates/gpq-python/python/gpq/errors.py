"""The exceptions gpq raises.

Every error is a :class:`GpqError`; most are also the built-in exception a
Python program would catch for the same trouble (``OSError`` for a file that
cannot be read, ``KeyError`` for a missing column, ``MemoryError`` for a read
that does not fit). The message is the Rust library's, naming the file, row
group, column and page where they apply; ``kind`` is its short machine name
(``"corrupt-page"``, ``"no-cuda-device"``, ...).
"""

__all__ = [
    "GpqError",
    "NoDeviceError",
    "InvalidArgumentError",
    "ColumnNotFoundError",
    "FileError",
    "CorruptFileError",
    "SchemaMismatchError",
    "UnsupportedError",
    "OutOfMemoryError",
    "ExportError",
    "DeviceError",
]


class GpqError(Exception):
    """Base class of every error gpq raises."""

    #: The Rust error's kind, e.g. ``"corrupt-page"``.
    kind: str = "gpq"

    def __str__(self) -> str:
        # KeyError would otherwise quote the message.
        return str(self.args[0]) if self.args else ""


class NoDeviceError(GpqError):
    """No usable CUDA device (no driver, no GPU, or no device with that ordinal)."""


class InvalidArgumentError(GpqError, ValueError):
    """Options that contradict each other or are out of range (a row group past the end, say)."""


class ColumnNotFoundError(GpqError, KeyError):
    """A selected column is not in the file."""


class FileError(GpqError, OSError):
    """The file could not be opened or read."""


class CorruptFileError(GpqError):
    """The file is not valid Parquet: bad magic, truncated, corrupt footer or page."""


class SchemaMismatchError(GpqError, ValueError):
    """A file of a multi-file read has other columns or types than the first."""


class UnsupportedError(GpqError, NotImplementedError):
    """A valid file uses a feature gpq does not read (yet), or is encrypted."""


class OutOfMemoryError(GpqError, MemoryError):
    """Device or host memory ran out, or a read needed more than its memory limit."""


class ExportError(GpqError, BufferError):
    """Columns cannot be handed over as asked (a column with nulls as a DLPack tensor, say)."""


class DeviceError(GpqError):
    """The GPU, its driver, a kernel or nvCOMP failed."""
