//! Device-resident Arrow columns, and their conversion to arrow-rs arrays on
//! the host.
//!
//! A [`DeviceColumn`] holds the Arrow buffers of one column in GPU memory:
//! the validity bitmap (LSB first, absent for required columns), the offsets
//! (strings and binary) and the values (a bitmap for booleans, 16-byte views
//! for `Utf8View` and `BinaryView`, whose characters are the column's
//! [`DeviceColumn::view_data`]). Its [`DeviceColumn::device_type`] says what
//! the buffers hold; where the schema asks for a type the device does not
//! build (a dictionary, a fixed-size list), the host casts on conversion.
//!
//! Other libraries take the buffers without a copy through the Arrow C
//! Device Data Interface ([`c_device`]: tables, columns, streams of
//! batches) and DLPack ([`dlpack`]: fixed-width columns and single buffers).
//! [`filter`] keeps the rows where a predicate holds, on the device, before
//! anything is copied.

use std::sync::Arc;

use arrow::array::{ArrayData, ArrayRef, RecordBatch, make_array};
use arrow::buffer::{Buffer, MutableBuffer};
use arrow::datatypes::{DataType, FieldRef, SchemaRef};

use crate::cuda::DeviceBuffer;
use crate::decode::DecodedColumn;
use crate::decode::layouts::VIEW_BUFFER_SHIFT;
use crate::error::Result;
use crate::stats::{ReadStats, SetupStats};

pub mod aggregate;
pub mod c_device;
pub mod dlpack;
pub mod filter;
mod pinned;

pub use c_device::{ARROW_DEVICE_CPU, ARROW_DEVICE_CUDA, FFI_ArrowDeviceArray, FFI_ArrowDeviceArrayStream, device_stream};
pub use dlpack::{ColumnBuffer, DeviceTensor};
pub use pinned::{PinnedHostPool, StagedBatches};

/// One column in device memory, in Arrow layout.
#[derive(Debug)]
pub struct DeviceColumn {
    field: FieldRef,
    device_type: DataType,
    /// Rows of every buffer before the column's first (Arrow's array offset).
    offset: usize,
    len: usize,
    null_count: usize,
    validity: Option<DeviceBuffer>,
    offsets: Option<DeviceBuffer>,
    values: DeviceBuffer,
    view_data: Option<DeviceBuffer>,
    children: Vec<DeviceColumn>,
}

impl From<DecodedColumn> for DeviceColumn {
    fn from(c: DecodedColumn) -> Self {
        DeviceColumn {
            field: c.field,
            device_type: c.device_type,
            offset: 0,
            len: c.len,
            null_count: c.null_count,
            validity: c.validity,
            offsets: c.offsets,
            values: c.values,
            view_data: c.view_data,
            children: c.children.into_iter().map(DeviceColumn::from).collect(),
        }
    }
}

/// Set bits of the bitmap `d` in `[first, first + len)`, from a host copy of
/// the bytes that cover them.
fn count_set_bits(d: &DeviceBuffer, first: usize, len: usize) -> Result<usize> {
    let (lo, hi) = (first / 8, (first + len).div_ceil(8));
    let mut host = vec![0u8; hi - lo];
    d.copy_range_into(lo as u64, &mut host)?;
    Ok((first..first + len).filter(|&i| host[i / 8 - lo] >> (i % 8) & 1 == 1).count())
}

fn host_buffer(d: &DeviceBuffer, len: usize) -> Result<Buffer> {
    let mut m = MutableBuffer::from_len_zeroed(len);
    d.copy_range_into(0, m.as_slice_mut())?;
    Ok(m.into())
}
impl DeviceColumn {
    /// The field as the result schema has it.
    pub fn field(&self) -> &FieldRef {
        &self.field
    }

    /// What the device buffers hold; where it differs from the field's type,
    /// the host casts on conversion (see the module docs).
    pub fn device_type(&self) -> &DataType {
        &self.device_type
    }

    /// Rows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the column has no rows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Nulls.
    pub fn null_count(&self) -> usize {
        self.null_count
    }

    /// Validity bitmap (LSB first), if the column is nullable.
    pub fn validity(&self) -> Option<&DeviceBuffer> {
        self.validity.as_ref()
    }

    /// Offsets: `i32` (or `i64` for large types) of string and binary
    /// columns, `i32` of lists and maps.
    pub fn offsets(&self) -> Option<&DeviceBuffer> {
        self.offsets.as_ref()
    }

    /// Values: fixed-width values, a bitmap for booleans, the characters of
    /// strings; empty for structs, lists and maps.
    pub fn values(&self) -> &DeviceBuffer {
        &self.values
    }

    /// The child columns of a struct (its fields), a list (its element) or
    /// a map (its entries, a struct of key and value); empty otherwise.
    pub fn children(&self) -> &[DeviceColumn] {
        &self.children
    }

    /// Whether the column is a struct, list or map.
    pub fn is_nested(&self) -> bool {
        !self.children.is_empty()
    }

    /// Device address of the values.
    pub fn values_ptr(&self) -> u64 {
        self.values.ptr()
    }

    /// View types: the characters the views of [`DeviceColumn::values`]
    /// point into (one allocation; Arrow data buffer `k` is its slice from
    /// byte `k * 2^30`, at most 2^31 bytes long).
    pub fn view_data(&self) -> Option<&DeviceBuffer> {
        self.view_data.as_ref()
    }

    /// Rows of every buffer before the column's first row (Arrow's array
    /// offset; 0 unless the column is a slice of what was decoded).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes of all of the column's device buffers.
    pub fn device_bytes(&self) -> u64 {
        self.values.len()
            + self.view_data.as_ref().map_or(0, |d| d.len())
            + self.validity.as_ref().map_or(0, |v| v.len())
            + self.offsets.as_ref().map_or(0, |o| o.len())
            + self.children.iter().map(DeviceColumn::device_bytes).sum::<u64>()
    }

    /// Stops charging the column's buffers to the read's memory budget.
    pub(crate) fn detach_budget(&mut self) {
        for b in [Some(&mut self.values), self.validity.as_mut(), self.offsets.as_mut(), self.view_data.as_mut()].into_iter().flatten() {
            b.detach_budget();
        }
        self.children.iter_mut().for_each(DeviceColumn::detach_budget);
    }

    /// Keeps rows `start..start + len` (clamped to the column): no copy,
    /// the buffers stay and the column's offset, length and null count move,
    /// as an Arrow slice does; children are untouched (list offsets and
    /// struct positions still index them from the parent's offset).
    pub(crate) fn slice(&mut self, start: usize, len: usize) -> Result<()> {
        let start = start.min(self.len);
        let len = len.min(self.len - start);
        if start == 0 && len == self.len {
            return Ok(());
        }
        let first = self.offset + start;
        if let (Some(v), true) = (&self.validity, self.null_count > 0) {
            self.null_count = if len == 0 { 0 } else { len - count_set_bits(v, first, len)? };
        }
        self.offset = first;
        self.len = len;
        Ok(())
    }

    /// Copies the column to the host as an arrow-rs array of the field's type.
    pub fn to_array(&self) -> Result<ArrayRef> {
        if !self.is_nested() {
            return self.leaf_to_array();
        }
        let array = make_array(self.host_data()?);
        if array.data_type() == self.field.data_type() {
            Ok(array)
        } else {
            Ok(arrow::compute::cast(&array, self.field.data_type())?)
        }
    }

    /// The host copy of a column in its device type (children included).
    fn host_data(&self) -> Result<ArrayData> {
        if !self.is_nested() {
            let b = self.host_buffers()?;
            return self.leaf_data(b);
        }
        let end = self.offset + self.len;
        let validity = match (&self.validity, self.null_count) {
            (Some(v), k) if k > 0 => Some(host_buffer(v, end.div_ceil(8))?),
            _ => None,
        };
        let mut builder = ArrayData::builder(self.device_type.clone())
            .len(self.len)
            .offset(self.offset)
            .null_count(self.null_count)
            .null_bit_buffer(validity);
        if let Some(offsets) = &self.offsets {
            let width = if matches!(self.device_type, DataType::LargeList(_)) { 8 } else { 4 };
            builder = builder.add_buffer(host_buffer(offsets, width * (end + 1))?);
        }
        for child in &self.children {
            builder = builder.add_child_data(child.host_data()?);
        }
        Ok(builder.build()?)
    }

    fn leaf_to_array(&self) -> Result<ArrayRef> {
        let b = self.host_buffers()?;
        self.assemble(b)
    }

    /// Host copies of a leaf column's buffers.
    fn host_buffers(&self) -> Result<HostBuffers> {
        // Every buffer from its start: the rows before the offset too.
        let n = self.offset + self.len;
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
        let view_data = match (&self.view_data, lens.view_data) {
            (Some(d), Some(len)) => Some(host_buffer(d, len)?),
            _ => None,
        };
        Ok(HostBuffers { validity, offsets, values, view_data })
    }

    /// Width of one offset of a string or binary column (4, or 8 for large types).
    fn offset_width(&self) -> usize {
        if matches!(self.device_type, DataType::LargeUtf8 | DataType::LargeBinary) { 8 } else { 4 }
    }

    /// How many bytes of each device buffer the host array needs. For
    /// strings and binary, `values` is the whole character buffer (the last
    /// offset, which says how much of it is used, is not known before the copy).
    pub(crate) fn host_lengths(&self) -> HostLengths {
        let n = self.offset + self.len;
        let validity = match (&self.validity, self.null_count) {
            (Some(_), k) if k > 0 => Some(n.div_ceil(8)),
            _ => None,
        };
        let (offsets, values) = match &self.device_type {
            DataType::Boolean => (None, n.div_ceil(8)),
            DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary => {
                (Some((n + 1) * self.offset_width()), self.values.len() as usize)
            }
            DataType::Utf8View | DataType::BinaryView => (None, 16 * n),
            t => {
                let width = t.primitive_width().unwrap_or(match t {
                    DataType::FixedSizeBinary(w) => *w as usize,
                    _ => 0,
                });
                (None, n * width)
            }
        };
        let view_data = self.view_data.as_ref().map(|d| d.len() as usize);
        HostLengths { validity, offsets, values, view_data }
    }

    /// Builds the arrow-rs array from host copies of the device buffers and
    /// casts it to the field's type where that differs.
    pub(crate) fn assemble(&self, buffers: HostBuffers) -> Result<ArrayRef> {
        self.in_field_type(make_array(self.leaf_data(buffers)?))
    }

    /// `array` (in the device type) cast to the field's type where that differs.
    pub(crate) fn in_field_type(&self, array: ArrayRef) -> Result<ArrayRef> {
        if array.data_type() == self.field.data_type() {
            Ok(array)
        } else {
            Ok(arrow::compute::cast(&array, self.field.data_type())?)
        }
    }
}

impl DeviceColumn {
    /// A leaf column's array data in its device type, from host buffers.
    fn leaf_data(&self, b: HostBuffers) -> Result<ArrayData> {
        if self.device_type == DataType::Null {
            return Ok(ArrayData::new_null(&DataType::Null, self.len));
        }
        let mut builder = ArrayData::builder(self.device_type.clone())
            .len(self.len)
            .offset(self.offset)
            .null_count(self.null_count)
            .null_bit_buffer(b.validity);
        if let Some(offsets) = b.offsets {
            builder = builder.add_buffer(offsets);
        }
        builder = builder.add_buffer(b.values);
        if let Some(data) = b.view_data {
            builder = builder.add_buffers(view_data_buffers(&data));
        }
        Ok(builder.build()?)
    }
}

/// The data buffers of a view array over `data`, a column's characters:
/// overlapping slices of it, as the device's views index them (see
/// `DeviceColumn::view_data`).
pub(crate) fn view_data_buffers(data: &Buffer) -> Vec<Buffer> {
    let (step, longest) = (1usize << VIEW_BUFFER_SHIFT, 1usize << (VIEW_BUFFER_SHIFT + 1));
    let mut buffers = Vec::new();
    let mut start = 0;
    while start < data.len() {
        buffers.push(data.slice_with_length(start, longest.min(data.len() - start)));
        start += step;
    }
    buffers
}

/// Host copies of a leaf column's device buffers.
#[derive(Debug, Clone)]
pub(crate) struct HostBuffers {
    /// The validity bitmap, when the column has nulls.
    pub validity: Option<Buffer>,
    /// Offsets of string and binary columns.
    pub offsets: Option<Buffer>,
    /// Values (views, for view types).
    pub values: Buffer,
    /// The characters of view types.
    pub view_data: Option<Buffer>,
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
    /// The characters of view types (the whole allocation).
    pub view_data: Option<usize>,
}

/// A table in device memory: one [`DeviceColumn`] per field of the schema.
#[derive(Debug)]
pub struct DeviceTable {
    schema: SchemaRef,
    columns: Vec<DeviceColumn>,
    num_rows: usize,
    stats: ReadStats,
}

impl DeviceTable {
    /// Assembles a table; `stats.decoded_bytes` is filled in from the columns.
    pub(crate) fn new(schema: SchemaRef, columns: Vec<DeviceColumn>, num_rows: usize, mut stats: ReadStats) -> DeviceTable {
        stats.decoded_bytes = columns.iter().map(DeviceColumn::device_bytes).sum();
        DeviceTable { schema, columns, num_rows, stats }
    }

    /// The result schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Columns in schema order.
    pub fn columns(&self) -> &[DeviceColumn] {
        &self.columns
    }

    /// The column named `name`, if any.
    pub fn column_by_name(&self, name: &str) -> Option<&DeviceColumn> {
        self.columns.iter().find(|c| c.field.name() == name)
    }

    /// Rows.
    pub fn num_rows(&self) -> usize {
        self.num_rows
    }

    /// What the read did: paths taken, bytes and per-stage times.
    pub fn stats(&self) -> &ReadStats {
        &self.stats
    }

    /// Copies the table to the host as one arrow-rs `RecordBatch`.
    pub fn to_record_batch(&self) -> Result<RecordBatch> {
        let arrays = self.columns.iter().map(|c| c.to_array()).collect::<Result<Vec<_>>>()?;
        let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(self.num_rows));
        Ok(RecordBatch::try_new_with_options(Arc::clone(&self.schema), arrays, &options)?)
    }

    /// Bytes of all device buffers.
    pub fn device_bytes(&self) -> u64 {
        self.columns.iter().map(DeviceColumn::device_bytes).sum()
    }

    /// Bytes a copy of the table to the host moves (for nested columns,
    /// all of their device buffers).
    pub fn host_copy_bytes(&self) -> u64 {
        self.columns
            .iter()
            .map(|c| {
                if c.is_nested() {
                    return c.device_bytes();
                }
                let l = c.host_lengths();
                (l.validity.unwrap_or(0) + l.offsets.unwrap_or(0) + l.values + l.view_data.unwrap_or(0)) as u64
            })
            .sum()
    }

    /// Counts `planning` (work done once for several tables) in this table's
    /// plan and total times.
    pub(crate) fn add_plan_time(&mut self, planning: std::time::Duration) {
        self.stats.plan += planning;
        self.stats.total += planning;
    }

    /// Records the device set-up the read paid for (already counted in its total).
    pub(crate) fn set_setup(&mut self, setup: SetupStats) {
        self.stats.setup = setup;
    }

    /// Records device set-up done for this table before its read began
    /// (the batch reader's, when it was built), adding it to the total.
    pub(crate) fn add_setup(&mut self, setup: SetupStats) {
        self.stats.total += setup.context + setup.kernels;
        self.stats.setup = setup;
    }

    /// Stops charging the table's buffers to the read's memory budget.
    pub(crate) fn detach_budget(&mut self) {
        self.columns.iter_mut().for_each(DeviceColumn::detach_budget);
    }
}
