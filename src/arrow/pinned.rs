//! Copying decoded tables to the host through pinned memory.
//!
//! A copy into fresh pageable memory runs far below PCIe speed: the driver
//! stages every byte through a pinned buffer of its own, and each new host
//! allocation is zeroed and faulted in page by page. That copy was most of
//! the time of gpq's DataFusion scans. [`DeviceTable::to_record_batch_pinned`]
//! instead queues asynchronous copies of all of a table's buffers into one
//! slab of page-locked memory and hands out arrow-rs buffers that point
//! into the slab, so no byte is copied twice.
//!
//! Page-locking memory is slow, so slabs come from a per-device
//! [`PinnedHostPool`] and go back to it when the last array using them is
//! dropped. The pool holds at most `GPQ_PINNED_HOST_BYTES` bytes (default: a
//! quarter of the host's memory, at most 16 GiB; `0` turns pinned copies
//! off); when a table does not fit, or page-locking fails, the copy goes to
//! pageable memory as [`DeviceTable::to_record_batch`] does, and the
//! fallback is logged.
//!
//! [`DeviceTable::into_staged_batches`] queues the same copies in chunks of
//! rows, an event after each, and hands out each chunk's batch as soon as
//! its bytes have landed, so a consumer works on the first rows while the
//! rest are still crossing the bus. The columns' per-row buffers (fixed-width
//! values, string views) are copied chunk by chunk; the rest (validity
//! bitmaps, string offsets and characters, booleans), which every chunk
//! may index anywhere, go whole with the first chunk.

use std::ptr::NonNull;
use std::sync::Arc;

use arrow::array::{ArrayData, ArrayRef, RecordBatch, RecordBatchOptions, make_array};
use arrow::buffer::{BooleanBuffer, Buffer, NullBuffer};
use arrow::datatypes::DataType;

use super::{DeviceColumn, DeviceTable, HostBuffers, HostLengths, view_data_buffers};
use crate::error::Result;
pub use crate::cuda::PinnedHostPool;
use crate::cuda::{GpuEvent, GpuStream, SlabLease};

/// Each buffer inside a slab starts at a multiple of this (arrow-rs' alignment).
const BUFFER_ALIGN: usize = 64;

/// Where one device buffer lands in the slab.
#[derive(Debug, Clone, Copy)]
struct Placement {
    offset: usize,
    len: usize,
}

/// Where a column's buffers land in the slab: validity, offsets, values, view data.
type ColumnPlacement = (Option<Placement>, Option<Placement>, Placement, Option<Placement>);

impl DeviceTable {
    /// Where each column's buffers go in one slab (each aligned for
    /// arrow-rs), and the slab's size.
    fn slab_layout(&self) -> (Vec<ColumnPlacement>, usize) {
        let lengths: Vec<HostLengths> = self.columns.iter().map(|c| c.host_lengths()).collect();
        let mut total = 0usize;
        let mut place = |len: usize| {
            let p = Placement { offset: total, len };
            total += len.div_ceil(BUFFER_ALIGN) * BUFFER_ALIGN;
            p
        };
        let placements = lengths
            .iter()
            .map(|l| (l.validity.map(&mut place), l.offsets.map(&mut place), place(l.values), l.view_data.map(&mut place)))
            .collect();
        (placements, total)
    }
}

impl DeviceTable {
    /// Copies the table to the host like [`DeviceTable::to_record_batch`],
    /// but through one pinned slab from the device's [`PinnedHostPool`]: all
    /// copies are queued at once and run at PCIe speed. The arrays of the
    /// result point into the slab, which returns to the pool when the last
    /// of them is dropped. Falls back to pageable memory when the pool is
    /// full (see the module docs).
    pub fn to_record_batch_pinned(&self) -> Result<RecordBatch> {
        self.to_record_batch_staged().map(|(batch, _)| batch)
    }

    /// [`DeviceTable::to_record_batch_pinned`], also saying whether the
    /// pinned slab was used (`false`: the pageable fallback ran).
    pub fn to_record_batch_staged(&self) -> Result<(RecordBatch, bool)> {
        let Some(first) = self.columns.first() else { return Ok((self.to_record_batch()?, false)) };
        let pool = PinnedHostPool::for_context(first.values.context());
        self.to_record_batch_in(&pool)
    }

    /// [`DeviceTable::to_record_batch_staged`] with a given pool.
    pub fn to_record_batch_in(&self, pool: &Arc<PinnedHostPool>) -> Result<(RecordBatch, bool)> {
        // Nested columns are copied buffer by buffer (their sizes depend on their children).
        if self.columns.iter().any(DeviceColumn::is_nested) {
            return Ok((self.to_record_batch()?, false));
        }
        let (placements, total) = self.slab_layout();
        if total == 0 {
            return Ok((self.to_record_batch()?, false));
        }
        let Some(lease) = pool.lease(total) else { return Ok((self.to_record_batch()?, false)) };
        let base = lease.as_mut_ptr();

        let mut streams: Vec<Arc<GpuStream>> = Vec::new();
        let mut queue = || -> Result<()> {
            for (column, (validity, offsets, values, view_data)) in self.columns.iter().zip(&placements) {
                let parts = [
                    (column.validity.as_ref(), validity.as_ref()),
                    (column.offsets.as_ref(), offsets.as_ref()),
                    (Some(&column.values), Some(values)),
                    (column.view_data.as_ref(), view_data.as_ref()),
                ];
                for (source, place) in parts {
                    let (Some(source), Some(place)) = (source, place) else { continue };
                    // SAFETY: the placement lies inside the slab, which outlives
                    // the copy: every stream is synchronized below, also when
                    // queueing fails, before the lease can go.
                    let stream = unsafe { source.copy_range_to_host_async(0, base.add(place.offset), place.len)? };
                    if let Some(s) = stream
                        && !streams.iter().any(|t| Arc::ptr_eq(t, &s))
                    {
                        streams.push(s);
                    }
                }
            }
            Ok(())
        };
        let queued = queue();
        if let Err(e) = streams.iter().try_for_each(|s| s.synchronize()) {
            // A copy may still be writing into the slab: never hand it out again.
            std::mem::forget(lease);
            return Err(e);
        }
        queued?;

        let lease: Arc<SlabLease> = Arc::new(lease);
        let arrays = self
            .columns
            .iter()
            .zip(slab_buffers(base, &placements, &lease))
            .map(|(column, host)| column.assemble(host))
            .collect::<Result<Vec<_>>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(self.num_rows));
        Ok((RecordBatch::try_new_with_options(Arc::clone(&self.schema), arrays, &options)?, true))
    }
}

/// Each column's buffers in the slab at `base` (held by `lease`), as
/// arrow-rs buffers where `placements` put them.
fn slab_buffers(base: *mut u8, placements: &[ColumnPlacement], lease: &Arc<SlabLease>) -> Vec<HostBuffers> {
    let buffer = |place: &Placement| -> Buffer {
        // SAFETY: `base + offset` is non-null, inside the slab and aligned to
        // BUFFER_ALIGN; the slab lives as long as `lease`, which the buffer owns a share of.
        unsafe {
            let ptr = NonNull::new_unchecked(base.add(place.offset));
            Buffer::from_custom_allocation(ptr, place.len, Arc::clone(lease) as _)
        }
    };
    placements
        .iter()
        .map(|(validity, offsets, values, view_data)| HostBuffers {
            validity: validity.as_ref().map(&buffer),
            offsets: offsets.as_ref().map(&buffer),
            values: buffer(values),
            view_data: view_data.as_ref().map(&buffer),
        })
        .collect()
}

/// Bytes per row of a column's values buffer, where the values are one
/// fixed-size slot per row (fixed-width types and string views); `None`
/// for bit-packed values, strings and binary with offsets, and null columns.
fn row_width(column: &DeviceColumn) -> Option<usize> {
    match &column.device_type {
        DataType::Null | DataType::Boolean => None,
        DataType::Utf8View | DataType::BinaryView => Some(16),
        DataType::FixedSizeBinary(w) => usize::try_from(*w).ok(),
        t => t.primitive_width(),
    }
}

/// A table's copy to the host through a pinned slab, in chunks of rows,
/// handed out as each chunk lands (see the module docs and
/// [`DeviceTable::into_staged_batches`]). Iterating yields one batch per
/// chunk, in order; the table's device buffers are released once every
/// copy is done. Dropping it early waits for the copies already queued.
pub struct StagedBatches {
    /// The table, kept until its copies are done.
    table: Option<DeviceTable>,
    state: Staged,
}

enum Staged {
    /// Copies queued into one slab; chunk `k` is rows `bounds[k]..bounds[k + 1]`.
    Pinned {
        lease: Arc<SlabLease>,
        /// Per column, its buffers in the slab.
        columns: Vec<HostBuffers>,
        bounds: Vec<usize>,
        /// Per chunk, the events recorded after its copies.
        events: Vec<Vec<GpuEvent>>,
        next: usize,
    },
    /// The table copied at once to pageable memory (nested columns,
    /// nothing to copy, or no pinned memory): one batch, until taken.
    Whole(Option<RecordBatch>),
    /// A copy failed: nothing more comes.
    Failed,
}

impl std::fmt::Debug for StagedBatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (chunks, next) = match &self.state {
            Staged::Pinned { bounds, next, .. } => (bounds.len() - 1, *next),
            Staged::Whole(batch) => (1, usize::from(batch.is_none())),
            Staged::Failed => (0, 0),
        };
        f.debug_struct("StagedBatches").field("chunks", &chunks).field("next", &next).field("pinned", &self.pinned()).finish()
    }
}

impl DeviceTable {
    /// Copies the table to the host like
    /// [`DeviceTable::to_record_batch_pinned`], in chunks of about
    /// `chunk_rows` rows: all copies are queued at once, and the returned
    /// iterator yields each chunk's batch as soon as its bytes have landed,
    /// so the caller can work on the first rows while the rest are still on
    /// their way. Takes the table: its device buffers must outlive the
    /// copies. Tables with nested columns, and copies that find no pinned
    /// memory, come as one batch (see [`StagedBatches::pinned`]).
    pub fn into_staged_batches(self, chunk_rows: usize) -> Result<StagedBatches> {
        let Some(first) = self.columns.first() else {
            let batch = self.to_record_batch()?;
            return Ok(StagedBatches { table: None, state: Staged::Whole(Some(batch)) });
        };
        let pool = PinnedHostPool::for_context(first.values.context());
        self.into_staged_batches_in(&pool, chunk_rows)
    }

    /// [`DeviceTable::into_staged_batches`] with a given pool.
    pub fn into_staged_batches_in(self, pool: &Arc<PinnedHostPool>, chunk_rows: usize) -> Result<StagedBatches> {
        let whole = |table: DeviceTable| -> Result<StagedBatches> {
            let batch = table.to_record_batch()?;
            Ok(StagedBatches { table: None, state: Staged::Whole(Some(batch)) })
        };
        if self.columns.iter().any(DeviceColumn::is_nested) {
            return whole(self);
        }
        let (placements, total) = self.slab_layout();
        if total == 0 {
            return whole(self);
        }
        let Some(lease) = pool.lease(total) else { return whole(self) };
        let base = lease.as_mut_ptr();
        let lease = Arc::new(lease);

        let n = self.num_rows;
        let step = chunk_rows.max(1);
        let mut bounds: Vec<usize> = (0..n).step_by(step).collect();
        bounds.push(n);
        if bounds.len() == 1 {
            bounds.insert(0, 0);
        }
        let mut events: Vec<Vec<GpuEvent>> = Vec::with_capacity(bounds.len() - 1);
        let mut all_streams: Vec<Arc<GpuStream>> = Vec::new();
        let mut queue = || -> Result<()> {
            for k in 0..bounds.len() - 1 {
                let mut streams: Vec<Arc<GpuStream>> = Vec::new();
                let mut copy = |source: &crate::cuda::DeviceBuffer, from: usize, place: &Placement, len: usize| -> Result<()> {
                    // SAFETY: `from + len` lies inside the placement, which lies
                    // inside the slab; the slab outlives the copy: its lease is
                    // held until every event is synchronized (also on failure).
                    let stream = unsafe { source.copy_range_to_host_async(from as u64, base.add(place.offset + from), len)? };
                    if let Some(s) = stream {
                        // Every stream with a copy queued, at once: a failure later
                        // in the queueing must still wait for it.
                        if !all_streams.iter().any(|t| Arc::ptr_eq(t, &s)) {
                            all_streams.push(Arc::clone(&s));
                        }
                        if !streams.iter().any(|t| Arc::ptr_eq(t, &s)) {
                            streams.push(s);
                        }
                    }
                    Ok(())
                };
                for (column, (validity, offsets, values, view_data)) in self.columns.iter().zip(&placements) {
                    let width = row_width(column);
                    if k == 0 {
                        let whole = [
                            column.validity.as_ref().zip(validity.as_ref()),
                            column.offsets.as_ref().zip(offsets.as_ref()),
                            width.is_none().then_some((&column.values, values)),
                            column.view_data.as_ref().zip(view_data.as_ref()),
                        ];
                        for (source, place) in whole.into_iter().flatten() {
                            copy(source, 0, place, place.len)?;
                        }
                    }
                    if let Some(w) = width {
                        let (from, to) = ((column.offset + bounds[k]) * w, (column.offset + bounds[k + 1]) * w);
                        copy(&column.values, from, values, to.min(values.len).saturating_sub(from))?;
                    }
                }
                let mut recorded = Vec::with_capacity(streams.len());
                for s in &streams {
                    let event = GpuEvent::new(s.context(), false)?;
                    event.record(s)?;
                    recorded.push(event);
                }
                events.push(recorded);
            }
            Ok(())
        };
        if let Err(e) = queue() {
            // A copy may still be writing into the slab: wait, and never hand
            // the slab out again if that fails.
            if all_streams.iter().try_for_each(|s| s.synchronize()).is_err() {
                std::mem::forget(Arc::clone(&lease));
            }
            return Err(e);
        }

        let columns = slab_buffers(base, &placements, &lease);
        Ok(StagedBatches { table: Some(self), state: Staged::Pinned { lease, columns, bounds, events, next: 0 } })
    }
}

impl DeviceTable {
    /// Rows per chunk of [`DeviceTable::into_staged_batches`] for chunks of
    /// about `chunk_bytes`, counting the buffers copied chunk by chunk
    /// (fixed-width values and string views; the rest goes with the first
    /// chunk). All the rows when no buffer is copied chunk by chunk.
    pub fn staged_chunk_rows(&self, chunk_bytes: u64) -> usize {
        let per_row: u64 = self.columns.iter().filter(|c| !c.is_nested()).filter_map(row_width).map(|w| w as u64).sum();
        if per_row == 0 {
            return self.num_rows.max(1);
        }
        usize::try_from((chunk_bytes / per_row).max(1)).unwrap_or(usize::MAX)
    }
}

impl StagedBatches {
    /// Whether the copy goes through pinned memory (`false`: the table was
    /// copied to pageable memory at once).
    pub fn pinned(&self) -> bool {
        match &self.state {
            Staged::Pinned { .. } => true,
            Staged::Whole(_) | Staged::Failed => false,
        }
    }

    /// Chunks (batches) the copy yields in all.
    pub fn chunks(&self) -> usize {
        match &self.state {
            Staged::Pinned { bounds, .. } => bounds.len() - 1,
            Staged::Whole(_) => 1,
            Staged::Failed => 0,
        }
    }

    /// The next chunk's batch, once its copy is done.
    fn next_batch(&mut self) -> Option<Result<RecordBatch>> {
        let Some(table) = self.table.as_ref() else {
            return match &mut self.state {
                Staged::Whole(batch) => batch.take().map(Ok),
                _ => None,
            };
        };
        let Staged::Pinned { lease, columns, bounds, events, next } = &mut self.state else { return None };
        let k = *next;
        if k + 1 >= bounds.len() {
            self.table = None;
            return None;
        }
        if let Err(e) = events[k].iter().try_for_each(GpuEvent::synchronize) {
            // A copy may still be writing into the slab: never hand it out again.
            std::mem::forget(Arc::clone(lease));
            self.state = Staged::Failed;
            self.table = None;
            return Some(Err(e));
        }
        *next += 1;
        let (start, len) = (bounds[k], bounds[k + 1] - bounds[k]);
        let batch = (|| -> Result<RecordBatch> {
            let arrays = table
                .columns
                .iter()
                .zip(columns.iter())
                .map(|(column, host)| chunk_array(column, host, lease, column.offset + start, len))
                .collect::<Result<Vec<_>>>()?;
            let options = RecordBatchOptions::new().with_row_count(Some(len));
            Ok(RecordBatch::try_new_with_options(Arc::clone(&table.schema), arrays, &options)?)
        })();
        if *next + 1 >= bounds.len() {
            // Every copy is done: the device buffers can go.
            self.table = None;
        }
        Some(batch)
    }
}

impl Iterator for StagedBatches {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Result<RecordBatch>> {
        self.next_batch()
    }
}

impl Drop for StagedBatches {
    fn drop(&mut self) {
        if let Staged::Pinned { lease, events, next, .. } = &self.state {
            // Copies still queued write into the slab: wait for them before
            // it can go back to the pool, or keep it from the pool for good.
            if events[(*next).min(events.len())..].iter().flatten().try_for_each(GpuEvent::synchronize).is_err() {
                std::mem::forget(Arc::clone(lease));
            }
        }
    }
}

/// Rows `start..start + len` of `column` (counted from its buffers' first
/// row, its offset included) as an arrow-rs array of the field's type,
/// over its buffers in the slab (`host`): per-row values sliced to the
/// rows, the rest shared whole.
fn chunk_array(column: &DeviceColumn, host: &HostBuffers, lease: &Arc<SlabLease>, start: usize, len: usize) -> Result<ArrayRef> {
    if column.device_type == DataType::Null {
        return column.in_field_type(make_array(ArrayData::new_null(&DataType::Null, len)));
    }
    let nulls = host.validity.as_ref().map(|v| NullBuffer::new(BooleanBuffer::new(v.clone(), start, len)));
    let mut builder = ArrayData::builder(column.device_type.clone()).len(len).nulls(nulls);
    match row_width(column) {
        Some(w) => {
            builder = builder.add_buffer(rows_of(&host.values, lease, start * w, len * w)?);
            if let Some(data) = &host.view_data {
                builder = builder.add_buffers(view_data_buffers(data));
            }
        }
        None => {
            builder = builder.offset(start);
            if let Some(offsets) = &host.offsets {
                builder = builder.add_buffer(offsets.clone());
            }
            builder = builder.add_buffer(host.values.clone());
        }
    }
    column.in_field_type(make_array(builder.build()?))
}

/// Bytes `offset..offset + len` of `whole` (a buffer in the slab of
/// `lease`) as a buffer of their own, not a slice: arrow-rs reports a
/// slice's memory as its whole allocation's, and DataFusion's memory
/// accounting would count the whole column once for every chunk.
fn rows_of(whole: &Buffer, lease: &Arc<SlabLease>, offset: usize, len: usize) -> Result<Buffer> {
    if offset.checked_add(len).is_none_or(|end| end > whole.len()) {
        return Err(crate::Error::Internal(format!("bytes {offset}+{len} of a staged chunk lie outside its buffer of {}", whole.len())));
    }
    // SAFETY: the range lies inside `whole` (checked above), which lies
    // inside the slab; the buffer owns a share of the lease, which keeps the
    // slab alive.
    Ok(unsafe {
        let ptr = NonNull::new_unchecked(whole.as_ptr().add(offset).cast_mut());
        Buffer::from_custom_allocation(ptr, len, Arc::clone(lease) as _)
    })
}
