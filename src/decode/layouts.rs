//! Stage 5: the layouts a schema asks for that the value and nesting kernels
//! do not write directly, made on the device.
//!
//! - String and binary views. Arrow's `Utf8View` and `BinaryView` (what
//!   DataFusion reads strings as by default) keep a 16-byte view per value
//!   over data buffers. The value kernels write offsets and characters; for
//!   every leaf whose field is a view type, `gpq_make_views` turns the
//!   offsets into views over the same characters, and the offsets are
//!   freed. The characters become the column's view data
//!   ([`DecodedColumn::view_data`]); the host exposes them as overlapping
//!   data buffers of at most 2^31 bytes starting every 2^30 bytes (see
//!   `views.cu`).
//! - Large lists. The nesting kernels write `i32` list offsets; a list whose
//!   field is `LargeList` gets them widened to `i64` (`gpq_widen_offsets`).
//!
//! Parents of changed nodes (structs, lists, maps) get their device types
//! updated. Fixed-size lists stay lists on the device (the host casts).

use std::path::Path;
use std::sync::Arc;

use arrow::datatypes::{DataType, Fields};

use super::DecodedColumn;
use super::nesting::device_field;
use super::descriptors::ViewsDesc;
use crate::cuda::{DeviceBuffer, GpuStream, as_bytes, from_bytes};
use crate::error::{CorruptKind, Error, Result};
use crate::gpu::{Kernel, KernelArgs, Kernels};

/// Threads per block of `gpq_make_views` and `gpq_widen_offsets`.
const BLOCK: u32 = 256;
/// Most blocks of one launch (the kernel strides over the rest).
const MAX_BLOCKS: u64 = 65_535;
/// Log2 of the spacing of the view data buffers (views.cu `VIEW_BUFFER_SHIFT`).
pub(crate) const VIEW_BUFFER_SHIFT: u32 = 30;

/// Builds the views and large-list offsets `col`'s fields ask for.
pub(crate) fn build_layouts(file: &Path, col: &mut DecodedColumn, stream: &Arc<GpuStream>) -> Result<()> {
    for child in &mut col.children {
        build_layouts(file, child, stream)?;
    }
    if !col.children.is_empty() {
        col.device_type = refreshed(&col.device_type, &col.children);
        if let (DataType::LargeList(_), DataType::List(child)) = (col.field.data_type(), &col.device_type) {
            let child = child.clone();
            widen_offsets(col, stream)?;
            col.device_type = DataType::LargeList(child);
        }
        return Ok(());
    }
    build_views(file, col, stream)
}

/// The `i32` offsets of a list as `i64`.
fn widen_offsets(col: &mut DecodedColumn, stream: &Arc<GpuStream>) -> Result<()> {
    let offsets = col.offsets.take().ok_or_else(|| Error::Internal(format!("{}: a list without offsets", col.field.name())))?;
    let n = col.len as u64 + 1;
    let wide = DeviceBuffer::alloc(stream, 8 * n, "large list offsets")?;
    let kernels = Kernels::for_context(stream.context())?;
    let grid = n.div_ceil(BLOCK as u64).min(MAX_BLOCKS) as u32;
    let mut args = KernelArgs::new().arg(offsets.ptr()).arg(wide.ptr()).arg(n);
    // SAFETY: arguments match gpq_widen_offsets; `offsets` holds n i32, `wide` n i64.
    unsafe { kernels.launch(Kernel::WidenOffsets, grid, BLOCK, 0, stream, &mut args)? };
    // Freed in stream order, after the kernel (the read's one stream).
    drop(offsets);
    col.offsets = Some(wide);
    Ok(())
}

/// Builds views for a leaf whose field asks for them.
fn build_views(file: &Path, col: &mut DecodedColumn, stream: &Arc<GpuStream>) -> Result<()> {
    let view = match (col.field.data_type(), &col.device_type) {
        (DataType::Utf8View, DataType::Utf8 | DataType::LargeUtf8) => DataType::Utf8View,
        (DataType::BinaryView, DataType::Binary | DataType::LargeBinary) => DataType::BinaryView,
        _ => return Ok(()),
    };
    let large = matches!(col.device_type, DataType::LargeUtf8 | DataType::LargeBinary);
    let offsets = col.offsets.take().ok_or_else(|| Error::Internal(format!("{}: strings without offsets", col.field.name())))?;
    let n = col.len as u64;
    let views = DeviceBuffer::alloc(stream, n.checked_mul(16).ok_or_else(|| Error::Internal("view bytes overflow".into()))?, "views")?;
    let desc = ViewsDesc {
        chars: col.values.ptr(),
        chars_len: col.values.len(),
        offsets: offsets.ptr(),
        views: views.ptr(),
        n,
        large: large as u32,
        status: 0,
    };
    if n > 0 {
        let kernels = Kernels::for_context(stream.context())?;
        let d_desc = DeviceBuffer::from_host(stream, as_bytes(&[desc]), "views descriptor")?;
        let grid = n.div_ceil(BLOCK as u64).min(MAX_BLOCKS) as u32;
        let mut args = KernelArgs::new().arg(d_desc.ptr());
        // SAFETY: arguments match gpq_make_views; offsets hold n + 1 entries, views n * 16 bytes.
        unsafe { kernels.launch(Kernel::MakeViews, grid, BLOCK, 0, stream, &mut args)? };
        let done: Vec<ViewsDesc> = from_bytes(&d_desc.to_host()?);
        if done[0].status != 0 {
            return Err(Error::Unsupported {
                file: file.to_path_buf(),
                column: col.field.name().clone(),
                what: format!(
                    "a {} value longer than 2^{VIEW_BUFFER_SHIFT} bytes ({})",
                    view,
                    CorruptKind::from_code(done[0].status).map_or("?", |k| k.description())
                ),
            });
        }
    }
    drop(offsets);
    col.view_data = Some(std::mem::replace(&mut col.values, views));
    col.device_type = view;
    Ok(())
}

/// `device_type` of a struct, list or map with its children's device types.
fn refreshed(device_type: &DataType, children: &[DecodedColumn]) -> DataType {
    match device_type {
        DataType::Struct(fields) => {
            DataType::Struct(fields.iter().zip(children).map(|(f, c)| device_field(f, &c.device_type)).collect::<Fields>())
        }
        DataType::List(f) => DataType::List(device_field(f, &children[0].device_type)),
        DataType::LargeList(f) => DataType::LargeList(device_field(f, &children[0].device_type)),
        DataType::Map(f, sorted) => DataType::Map(device_field(f, &children[0].device_type), *sorted),
        other => other.clone(),
    }
}
