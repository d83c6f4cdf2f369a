//! Device-resident Arrow columns, and their conversion to arrow-rs arrays on
//! the host.
//!
//! A [`DeviceColumn`] holds the Arrow buffers of one column in GPU memory:
//! the validity bitmap (LSB first, absent for required columns), the offsets
//! (strings and binary) and the values (a bitmap for booleans). Its
//! [`DeviceColumn::device_type`] says what the buffers hold; where the schema
//! asks for a type the device does not build (a view type, a dictionary), the
//! host casts on conversion.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{ArrayData, ArrayRef, RecordBatch, make_array};
use arrow::buffer::{Buffer, MutableBuffer};
use arrow::datatypes::{DataType, FieldRef, SchemaRef};

use crate::decode::decompress::DecompressStats;
use crate::error::Result;
use crate::gpu::DeviceBuffer;
use crate::io::IoStats;

mod pinned;

pub use pinned::PinnedHostPool;

/// One column in device memory, in Arrow layout.
#[derive(Debug)]
pub struct DeviceColumn {
    /// The field as the result schema has it.
    pub field: FieldRef,
    /// What the device buffers hold (may differ from the field's type; see the module docs).
    pub device_type: DataType,
    /// Rows.
    pub len: usize,
    /// Nulls.
    pub null_count: usize,
    /// Validity bitmap (LSB first), if the column is nullable.
    pub validity: Option<DeviceBuffer>,
    /// Offsets (`i32`, or `i64` for large types) of string and binary columns.
    pub offsets: Option<DeviceBuffer>,
    /// Values: fixed-width values, a bitmap for booleans, the characters of strings.
    pub values: DeviceBuffer,
}

fn host_buffer(d: &DeviceBuffer, len: usize) -> Result<Buffer> {
    let mut m = MutableBuffer::from_len_zeroed(len);
    d.copy_range_into(0, m.as_slice_mut())?;
    Ok(m.into())
}
impl DeviceColumn {
    /// Device address of the values.
    pub fn values_ptr(&self) -> u64 {
        self.values.ptr()
    }

    /// Copies the column to the host as an arrow-rs array of the field's type.
    pub fn to_array(&self) -> Result<ArrayRef> {
        let n = self.len;
        let lens = self.host_lengths();
        let validity = match (&self.validity, lens.validity) {
            (Some(v), Some(len)) => Some(host_buffer(v, len)?),
            _ => None,
        };
        let (offsets, values) = match (&self.offsets, lens.offsets) {
            (Some(offsets), Some(len)) => {
                let off = host_buffer(offsets, len)?;
                let total = if self.offset_width() == 8 {
                    off.typed_data::<i64>()[n] as usize
                } else {
                    off.typed_data::<i32>()[n] as u32 as usize
                };
                let values = host_buffer(&self.values, total)?;
                (Some(off), values)
            }
            _ => (None, host_buffer(&self.values, lens.values)?),
        };
        self.assemble(validity, offsets, values)
    }

    /// Width of one offset of a string or binary column (4, or 8 for large types).
    fn offset_width(&self) -> usize {
        if matches!(self.device_type, DataType::LargeUtf8 | DataType::LargeBinary) { 8 } else { 4 }
    }

    /// How many bytes of each device buffer the host array needs. For
    /// strings and binary, `values` is the whole character buffer (the last
    /// offset, which says how much of it is used, is not known before the copy).
    pub(crate) fn host_lengths(&self) -> HostLengths {
        let n = self.len;
        let validity = match (&self.validity, self.null_count) {
            (Some(_), k) if k > 0 => Some(n.div_ceil(8)),
            _ => None,
        };
        let (offsets, values) = match &self.device_type {
            DataType::Boolean => (None, n.div_ceil(8)),
            DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary => {
                (Some((n + 1) * self.offset_width()), self.values.len() as usize)
            }
            t => {
                let width = t.primitive_width().unwrap_or(match t {
                    DataType::FixedSizeBinary(w) => *w as usize,
                    _ => 0,
                });
                (None, n * width)
            }
        };
        HostLengths { validity, offsets, values }
    }

    /// Builds the arrow-rs array from host copies of the device buffers and
    /// casts it to the field's type where that differs.
    pub(crate) fn assemble(&self, validity: Option<Buffer>, offsets: Option<Buffer>, values: Buffer) -> Result<ArrayRef> {
        let mut builder = ArrayData::builder(self.device_type.clone())
            .len(self.len)
            .null_count(self.null_count)
            .null_bit_buffer(validity);
        if let Some(offsets) = offsets {
            builder = builder.add_buffer(offsets);
        }
        let array = make_array(builder.add_buffer(values).build()?);
        if array.data_type() == self.field.data_type() {
            Ok(array)
        } else {
            Ok(arrow::compute::cast(&array, self.field.data_type())?)
        }
    }
}

/// Bytes of each device buffer of a column that its host copy needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostLengths {
    /// The validity bitmap, when the column has nulls.
    pub validity: Option<usize>,
    /// The offsets of string and binary columns.
    pub offsets: Option<usize>,
    /// The values (see [`DeviceColumn::host_lengths`]).
    pub values: usize,
}

/// Statistics of one read: where the bytes came from and where time went.
#[derive(Debug, Clone, Default)]
pub struct ReadStats {
    /// The IO layer's report (path, bytes, wall time).
    pub io: Option<IoStats>,
    /// Footer and planning.
    pub plan: Duration,
    /// Page headers on the device.
    pub page_headers: Duration,
    /// Decompression.
    pub decompress: Duration,
    /// Value decoding (levels, dictionaries, values, strings).
    pub decode: Duration,
    /// Whole read, planning to last kernel.
    pub total: Duration,
    /// Decompression report.
    pub decompression: DecompressStats,
    /// Pages decoded (data and dictionary).
    pub pages: usize,
    /// Bytes of the decoded device columns.
    pub decoded_bytes: u64,
}

impl ReadStats {
    /// One line per stage, for logs and the CLI.
    pub fn summary(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let io = self.io.as_ref();
        format!(
            "io path {} ({:.2} GB read, {:.1} ms), decompression {} ({} GPU / {} CPU pages), plan {:.1} ms, page headers {:.1} ms, decompress {:.1} ms, decode {:.1} ms, total {:.1} ms",
            io.map(|s| s.path.name()).unwrap_or("-"),
            io.map(|s| s.bytes_read as f64 / 1e9).unwrap_or(0.0),
            io.map(|s| ms(s.wall)).unwrap_or(0.0),
            self.decompression.path(),
            self.decompression.gpu_pages,
            self.decompression.cpu_pages,
            ms(self.plan),
            ms(self.page_headers),
            ms(self.decompress),
            ms(self.decode),
            ms(self.total),
        )
    }
}

/// A table in device memory: one [`DeviceColumn`] per field of the schema.
#[derive(Debug)]
pub struct DeviceTable {
    /// The result schema.
    pub schema: SchemaRef,
    /// Columns in schema order.
    pub columns: Vec<DeviceColumn>,
    /// Rows.
    pub num_rows: usize,
    /// What the read did.
    pub stats: ReadStats,
}

impl DeviceTable {
    /// Copies the table to the host as one arrow-rs `RecordBatch`.
    pub fn to_record_batch(&self) -> Result<RecordBatch> {
        let arrays = self.columns.iter().map(|c| c.to_array()).collect::<Result<Vec<_>>>()?;
        let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(self.num_rows));
        Ok(RecordBatch::try_new_with_options(Arc::clone(&self.schema), arrays, &options)?)
    }

    /// Bytes of all device buffers.
    pub fn device_bytes(&self) -> u64 {
        self.columns
            .iter()
            .map(|c| c.values.len() + c.validity.as_ref().map_or(0, |v| v.len()) + c.offsets.as_ref().map_or(0, |o| o.len()))
            .sum()
    }
}
