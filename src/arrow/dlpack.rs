//! DLPack: device columns as tensors that PyTorch, CuPy, JAX and NumPy take
//! without a copy.
//!
//! DLPack describes a strided array of one element type, with no validity
//! and no variable-width elements. So a *column* is a tensor only when its
//! values are fixed-width numbers (integers, floats, and dates, times,
//! timestamps and durations as their integer representation) and it has no
//! nulls ([`DeviceColumn::values_tensor`]); decimals (DLPack has no 128-bit
//! decimal), booleans (bit-packed) and strings are refused with
//! [`Error::Export`]. Every *buffer* of any column (validity bitmap,
//! offsets, values, the characters of view columns) is a one-dimensional
//! tensor too ([`DeviceColumn::buffer_tensor`]), for consumers that know the
//! Arrow layout.
//!
//! A [`DeviceTensor`] only describes memory; [`DeviceTensor::into_dlpack`]
//! and [`DeviceTensor::into_dlpack_versioned`] turn it into the heap
//! structs a consumer takes over, holding a reference to whatever owns the
//! memory (the table) until the consumer calls the deleter. As with the
//! Arrow export, reads return with their work finished, so no stream
//! synchronization is owed to the consumer; when the consumer calls the
//! deleter, the device finishes the consumer's queued work before the
//! memory may be freed. The memory is shared, and writable: a consumer that
//! writes to it changes the table. On the CPU emulator the tensors are host
//! memory (`kDLCPU`).

use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;

use arrow::datatypes::DataType;

use super::DeviceColumn;
use crate::cuda::DeviceBuffer;
use crate::error::{Error, Result};

/// `DLDeviceType` of host memory.
pub const KDL_CPU: i32 = 1;
/// `DLDeviceType` of CUDA device memory.
pub const KDL_CUDA: i32 = 2;

/// The DLPack version the versioned structs declare.
pub const DLPACK_VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 1 };

/// DLPack's `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDevice {
    /// [`KDL_CUDA`] or [`KDL_CPU`].
    pub device_type: i32,
    /// The device ordinal.
    pub device_id: i32,
}

/// DLPack's `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    /// 0 signed integer, 1 unsigned integer, 2 IEEE float.
    pub code: u8,
    /// Bits per element.
    pub bits: u8,
    /// Lanes per element (always 1 here).
    pub lanes: u16,
}

impl DLDataType {
    /// A signed integer of `bits`.
    pub const fn int(bits: u8) -> DLDataType {
        DLDataType { code: 0, bits, lanes: 1 }
    }

    /// An unsigned integer of `bits`.
    pub const fn uint(bits: u8) -> DLDataType {
        DLDataType { code: 1, bits, lanes: 1 }
    }

    /// An IEEE float of `bits`.
    pub const fn float(bits: u8) -> DLDataType {
        DLDataType { code: 2, bits, lanes: 1 }
    }

    /// Bytes per element.
    pub fn bytes(&self) -> usize {
        self.bits as usize / 8 * self.lanes as usize
    }

    /// The `typestr` of the CUDA Array Interface (`<i8`, `|u1`, `<f4`).
    pub fn typestr(&self) -> String {
        let kind = match self.code {
            0 => 'i',
            1 => 'u',
            _ => 'f',
        };
        let order = if self.bits == 8 { '|' } else { '<' };
        format!("{order}{kind}{}", self.bits / 8)
    }
}

/// DLPack's `DLTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// The first element (after `byte_offset`).
    pub data: *mut c_void,
    /// Where the memory is.
    pub device: DLDevice,
    /// Dimensions (1 here).
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// Null: compact row-major.
    pub strides: *mut i64,
    /// Bytes from `data` to the first element (0 here).
    pub byte_offset: u64,
}

/// DLPack's (pre-1.0) `DLManagedTensor`, the `"dltensor"` capsule's content.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's state.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor; the consumer calls it once, when done.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// DLPack's version pair.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLPackVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// DLPack 1.x's `DLManagedTensorVersioned`, the `"dltensor_versioned"` capsule's content.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The DLPack version of this struct.
    pub version: DLPackVersion,
    /// The producer's state.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor; the consumer calls it once, when done.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// Bit flags (read-only, copied); none set.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// The buffers of an Arrow column, for [`DeviceColumn::buffer_tensor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnBuffer {
    /// The validity bitmap (LSB first), as bytes.
    Validity,
    /// The offsets of strings, binary and lists (`int32`, or `int64` for large types).
    Offsets,
    /// The values: typed for fixed-width numbers, bytes otherwise (bit-packed
    /// booleans, characters, 16-byte views, fixed-size binary).
    Values,
    /// The characters that view columns' views point into, as bytes.
    ViewData,
}

/// A one-dimensional tensor over device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceTensor {
    /// Address of the first element.
    pub ptr: u64,
    /// Elements.
    pub len: usize,
    /// Element type.
    pub dtype: DLDataType,
    /// Where the memory is.
    pub device: DLDevice,
}

/// DLPack's element type for the values of an Arrow type, where it has one.
pub fn dlpack_type(t: &DataType) -> Option<DLDataType> {
    use DataType as D;
    Some(match t {
        D::Int8 => DLDataType::int(8),
        D::Int16 => DLDataType::int(16),
        D::Int32 | D::Date32 | D::Time32(_) => DLDataType::int(32),
        D::Int64 | D::Date64 | D::Time64(_) | D::Timestamp(..) | D::Duration(_) => DLDataType::int(64),
        D::UInt8 => DLDataType::uint(8),
        D::UInt16 => DLDataType::uint(16),
        D::UInt32 => DLDataType::uint(32),
        D::UInt64 => DLDataType::uint(64),
        D::Float16 => DLDataType::float(16),
        D::Float32 => DLDataType::float(32),
        D::Float64 => DLDataType::float(64),
        _ => return None,
    })
}

fn device_of(b: &DeviceBuffer) -> DLDevice {
    let ctx = b.context();
    if ctx.is_emulated() {
        DLDevice { device_type: KDL_CPU, device_id: 0 }
    } else {
        DLDevice { device_type: KDL_CUDA, device_id: ctx.ordinal() as i32 }
    }
}

impl DeviceColumn {
    /// The column's rows as a tensor of its values: fixed-width numbers
    /// without nulls only (see the [module docs](self)).
    pub fn values_tensor(&self) -> Result<DeviceTensor> {
        let name = self.field.name();
        let dtype = dlpack_type(&self.device_type).ok_or_else(|| {
            Error::Export(format!(
                "column {name} of type {} as a DLPack tensor: DLPack has no element type for it (integers, floats, dates, times, \
                 timestamps and durations only); its buffers can still be exported one by one",
                self.device_type
            ))
        })?;
        if self.null_count > 0 {
            return Err(Error::Export(format!(
                "column {name} as a DLPack tensor: it has {} nulls and DLPack has no validity; export its values and validity buffers instead",
                self.null_count
            )));
        }
        Ok(DeviceTensor {
            ptr: self.values.ptr() + (self.offset * dtype.bytes()) as u64,
            len: self.len,
            dtype,
            device: device_of(&self.values),
        })
    }

    /// One of the column's Arrow buffers as a tensor, from its start (the
    /// column's [offset](DeviceColumn::offset) applies to it as in Arrow);
    /// `None` where the column has no such buffer (no validity on a
    /// required column, no offsets on a fixed-width one).
    pub fn buffer_tensor(&self, which: ColumnBuffer) -> Result<Option<DeviceTensor>> {
        let rows = self.offset + self.len;
        let bytes = DLDataType::uint(8);
        let tensor = |b: &DeviceBuffer, len: usize, dtype: DLDataType| -> Result<Option<DeviceTensor>> {
            if (len * dtype.bytes()) as u64 > b.len() {
                return Err(Error::Internal(format!(
                    "buffer of {} bytes described as {len} elements of {} bytes",
                    b.len(),
                    dtype.bytes()
                )));
            }
            Ok(Some(DeviceTensor { ptr: b.ptr(), len, dtype, device: device_of(b) }))
        };
        match which {
            ColumnBuffer::Validity => match &self.validity {
                Some(v) => tensor(v, rows.div_ceil(8), bytes),
                None => Ok(None),
            },
            ColumnBuffer::Offsets => match &self.offsets {
                Some(o) => {
                    let large = matches!(self.device_type, DataType::LargeUtf8 | DataType::LargeBinary | DataType::LargeList(_));
                    tensor(o, rows + 1, if large { DLDataType::int(64) } else { DLDataType::int(32) })
                }
                None => Ok(None),
            },
            ColumnBuffer::ViewData => match &self.view_data {
                Some(d) => tensor(d, d.len() as usize, bytes),
                None => Ok(None),
            },
            ColumnBuffer::Values => match &self.device_type {
                t if self.is_nested() || matches!(t, DataType::Null | DataType::Struct(_) | DataType::List(_) | DataType::LargeList(_) | DataType::Map(..)) => Ok(None),
                DataType::Boolean => tensor(&self.values, rows.div_ceil(8), bytes),
                DataType::Utf8View | DataType::BinaryView => tensor(&self.values, 16 * rows, bytes),
                DataType::FixedSizeBinary(w) => tensor(&self.values, *w as usize * rows, bytes),
                DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary => tensor(&self.values, self.values.len() as usize, bytes),
                t => match (dlpack_type(t), t.primitive_width()) {
                    (Some(dtype), _) => tensor(&self.values, rows, dtype),
                    (None, Some(width)) => tensor(&self.values, rows * width, bytes),
                    (None, None) => Ok(None),
                },
            },
        }
    }
}

/// What a DLPack export owns until the consumer's deleter runs.
struct TensorState {
    _owner: Arc<dyn Any + Send + Sync>,
    shape: [i64; 1],
    device: DLDevice,
}

impl Drop for TensorState {
    /// As for Arrow exports (see [`super::c_device`]): the consumer's queued
    /// work finishes before the memory may go back to the pool.
    fn drop(&mut self) {
        if self.device.device_type == KDL_CUDA {
            // (Looking the context up binds it: the consumer's thread keeps its own.)
            crate::cuda::keeping_current_context(|| {
                if let Ok(ctx) = crate::cuda::GpuContext::get(self.device.device_id as usize) {
                    let _ = ctx.synchronize();
                }
            });
        }
    }
}

impl DeviceTensor {
    fn dl_tensor(&self, state: &mut TensorState) -> DLTensor {
        state.shape[0] = self.len as i64;
        DLTensor {
            data: self.ptr as *mut c_void,
            device: self.device,
            ndim: 1,
            dtype: self.dtype,
            shape: state.shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }

    /// The tensor as a (pre-1.0) `DLManagedTensor` on the heap, holding
    /// `owner` (whatever keeps the memory) until the consumer calls its
    /// deleter, which it must do exactly once.
    pub fn into_dlpack(self, owner: Arc<dyn Any + Send + Sync>) -> *mut DLManagedTensor {
        let mut state = Box::new(TensorState { _owner: owner, shape: [0], device: self.device });
        let dl_tensor = self.dl_tensor(&mut state);
        Box::into_raw(Box::new(DLManagedTensor { dl_tensor, manager_ctx: Box::into_raw(state).cast(), deleter: Some(delete_managed) }))
    }

    /// The tensor as a DLPack 1.x `DLManagedTensorVersioned` on the heap,
    /// as [`DeviceTensor::into_dlpack`] does.
    pub fn into_dlpack_versioned(self, owner: Arc<dyn Any + Send + Sync>) -> *mut DLManagedTensorVersioned {
        let mut state = Box::new(TensorState { _owner: owner, shape: [0], device: self.device });
        let dl_tensor = self.dl_tensor(&mut state);
        Box::into_raw(Box::new(DLManagedTensorVersioned {
            version: DLPACK_VERSION,
            manager_ctx: Box::into_raw(state).cast(),
            deleter: Some(delete_versioned),
            flags: 0,
            dl_tensor,
        }))
    }
}

unsafe extern "C" fn delete_managed(t: *mut DLManagedTensor) {
    if t.is_null() {
        return;
    }
    // SAFETY: `t` and its manager_ctx were boxed by `into_dlpack`; the
    // consumer calls the deleter once.
    unsafe {
        let t = Box::from_raw(t);
        if !t.manager_ctx.is_null() {
            drop(Box::from_raw(t.manager_ctx.cast::<TensorState>()));
        }
    }
}

unsafe extern "C" fn delete_versioned(t: *mut DLManagedTensorVersioned) {
    if t.is_null() {
        return;
    }
    // SAFETY: as in `delete_managed`, for `into_dlpack_versioned`.
    unsafe {
        let t = Box::from_raw(t);
        if !t.manager_ctx.is_null() {
            drop(Box::from_raw(t.manager_ctx.cast::<TensorState>()));
        }
    }
}
