"""A minimal consumer of the Arrow C device stream interface, written with
ctypes against the specification (pyarrow imports device *arrays*, but not
device streams): pulls every array of an ``arrow_device_array_stream``
capsule and reports errors as the stream reports them."""

import ctypes

_GET_SCHEMA = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_GET_NEXT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_GET_LAST_ERROR = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)
_RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

ARROW_DEVICE_CPU = 1
ARROW_DEVICE_CUDA = 2

# struct ArrowArray is 80 bytes (release at 64); ArrowDeviceArray adds
# device_id (80), device_type (88), sync_event (96) and reserved (104..128).
ARRAY_RELEASE = 64
DEVICE_ARRAY_SIZE = 128
SCHEMA_SIZE = 72


class DeviceStream(ctypes.Structure):
    _fields_ = [
        ("device_type", ctypes.c_int32),
        ("get_schema", _GET_SCHEMA),
        ("get_next", _GET_NEXT),
        ("get_last_error", _GET_LAST_ERROR),
        ("release", _RELEASE),
        ("private_data", ctypes.c_void_p),
    ]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def capsule_pointer(capsule, name: bytes) -> int:
    return _get_pointer(capsule, name)


class StreamError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class DeviceStreamReader:
    """Reads an ``arrow_device_array_stream`` capsule in place (the capsule
    keeps owning the stream and releases it when collected)."""

    def __init__(self, capsule):
        self.capsule = capsule
        self.ptr = capsule_pointer(capsule, b"arrow_device_array_stream")
        self.stream = DeviceStream.from_address(self.ptr)

    @property
    def device_type(self) -> int:
        return self.stream.device_type

    def _error(self, code: int) -> StreamError:
        msg = self.stream.get_last_error(self.ptr)
        return StreamError(code, msg.decode() if msg else "")

    def schema_into(self, buf) -> None:
        code = self.stream.get_schema(self.ptr, ctypes.addressof(buf))
        if code:
            raise self._error(code)

    def next_into(self, buf) -> bool:
        """Writes the next device array into ``buf`` (releasing the array
        still there, if the caller did not move it out); False at the end."""
        release_array(buf)
        code = self.stream.get_next(self.ptr, ctypes.addressof(buf))
        if code:
            raise self._error(code)
        return ctypes.c_void_p.from_buffer(buf, ARRAY_RELEASE).value is not None


def release_array(buf) -> None:
    """Calls the release callback of the (device) array in ``buf`` if it is live."""
    release = ctypes.c_void_p.from_buffer(buf, ARRAY_RELEASE).value
    if release is not None:
        _RELEASE(release)(ctypes.addressof(buf))


def device_fields(buf):
    """(device_type, device_id, sync_event) of a device array in ``buf``."""
    device_id = ctypes.c_int64.from_buffer(buf, 80).value
    device_type = ctypes.c_int32.from_buffer(buf, 88).value
    sync_event = ctypes.c_void_p.from_buffer(buf, 96).value
    return device_type, device_id, sync_event
