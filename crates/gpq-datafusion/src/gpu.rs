//! The GPU backend: each run of a partition's row groups in one file is read
//! by gpq's batch reader ([`gpq::DeviceReaderBuilder`]), and each of its
//! batches copied to the host through pinned memory
//! ([`gpq::DeviceTable::to_record_batch_staged`]).
//!
//! The reader cuts the run into passes of whole row groups of about
//! [`GpqTableOptions::gpu_read_bytes`](crate::GpqTableOptions::gpu_read_bytes)
//! of projected compressed bytes and reads the next pass while the device
//! decodes the current one. With the page index's row selections it reads
//! and decodes, of each row group, only the pages of its span (its first to
//! its last selected row), cut on the device; pages before and after the
//! span cost neither IO nor decode time. Each row group is read once, however
//! many runs of selected rows it has: the rows between them are cut on the
//! host after the copy. A scan's row limit goes to the reader too where the
//! spans hold only selected rows, so the last pages it would not need stay
//! unread.
//!
//! With filters of its own (see the `filter` module), the scan evaluates
//! them on the device on each decoded batch, only on the rows of the
//! span's selected runs, and copies to the host only the output columns'
//! kept rows. (The rows between selected runs are not certain to fail the
//! filters: statistics leave NaN out of a page's range.) A batch the device
//! cannot filter is copied whole, cut and filtered on the host (counted in
//! `device_filter_fallbacks`).
//!
//! What the GPU cannot decode (an `Unsupported` error, raised before any IO
//! or, rarely, while decoding) is decoded on the CPU when fallback is
//! allowed, logged and counted. A read that loses the GPU context
//! ([`gpq::Error::is_context_lost`]) is finished on the CPU instead of
//! failing the query, from the first row the device did not send, logged and
//! counted (`gpu_context_lost_fallbacks`, one per run); when the device could
//! not be reset, the rest of the partition decodes on the CPU too. A device
//! read that returns other than the rows selected is an error.
//! Errors that are the file's fault ([`gpq::Error::is_bad_input`]) still fail
//! the query: corrupt data never falls back silently.

use std::time::Instant;

use arrow::array::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use tracing::{debug, warn};

use gpq::{ColumnSelector, DeviceReaderBuilder, DeviceTable, Error};

use crate::cpu::read_run;
use crate::file::GpqFile;
use crate::filter::ScanFilter;
use crate::late::{LatePlan, LateProgress, read_late};
use crate::scan::{Decoder, PartitionScan, Sink, conform, file_runs, read_layout};
use crate::to_df_error;
use crate::units::ScanUnit;

/// gpq on the GPU.
#[derive(Debug)]
pub(crate) struct GpuDecoder;

/// Passes one partition's reader decodes at once. One: the partitions
/// already keep the device busy together, and each pass in flight holds its
/// own device memory (the reader still reads the next pass's chunks while
/// the current one decodes).
const DECODE_AHEAD: usize = 1;

impl Decoder for GpuDecoder {
    fn produce(&self, scan: &PartitionScan, sink: &mut Sink) -> Result<()> {
        // Set when the device lost its context and could not get a fresh one:
        // the rest of the partition decodes on the CPU.
        let mut device_gone = false;
        for run in file_runs(&scan.units) {
            if device_gone {
                scan.metrics.gpu_context_lost_fallbacks.add(1);
                read_run(scan, run, 0, sink)?;
            } else {
                device_gone = read_on_device(scan, run, sink)?;
            }
            if sink.done() {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// How a run is read on the device: one span of rows per unit, from its
/// first selected row to its last (a row group with several selected runs
/// is still read once, only the pages of its span), and within each span the
/// rows the page index keeps, cut on the host after the copy.
pub(crate) struct RunSpans {
    /// For the reader: each unit's span (`None`: every row of every unit).
    pub selection: Option<RowSelection>,
    /// Per unit, its span's rows and the selectors inside it (`None`: all).
    pub spans: Vec<(usize, Option<Vec<RowSelector>>)>,
    /// Per unit, its span's first row in its row group.
    pub starts: Vec<usize>,
}

impl RunSpans {
    pub fn new(units: &[ScanUnit]) -> RunSpans {
        let mut reader: Vec<RowSelector> = Vec::new();
        let mut spans = Vec::with_capacity(units.len());
        let mut starts = Vec::with_capacity(units.len());
        for u in units {
            let Some(selection) = &u.selection else {
                reader.push(RowSelector::select(u.rg_rows));
                spans.push((u.rg_rows, None));
                starts.push(0);
                continue;
            };
            // The span: from the first selected row to the end of the last.
            let (mut at, mut first, mut end) = (0usize, None, 0usize);
            for s in selection.iter() {
                if !s.skip && s.row_count > 0 {
                    first.get_or_insert(at);
                    end = at + s.row_count;
                }
                at += s.row_count;
            }
            let first = first.unwrap_or(0).min(u.rg_rows);
            let end = end.clamp(first, u.rg_rows);
            reader.extend([RowSelector::skip(first), RowSelector::select(end - first), RowSelector::skip(u.rg_rows - end)]);
            // The selectors inside the span.
            let mut inner: Vec<RowSelector> = Vec::new();
            let mut at = 0usize;
            for s in selection.iter() {
                let (a, b) = (at.max(first), (at + s.row_count).min(end));
                at += s.row_count;
                if a < b {
                    inner.push(if s.skip { RowSelector::skip(b - a) } else { RowSelector::select(b - a) });
                }
            }
            let whole = inner.iter().all(|s| !s.skip);
            spans.push((end - first, (!whole).then_some(inner)));
            starts.push(first);
        }
        let all = units.iter().all(|u| u.selection.is_none());
        RunSpans { selection: (!all).then(|| RowSelection::from(reader)), spans, starts }
    }

    /// Whether the reader's rows are the scan's rows (no gaps inside spans).
    fn exact(&self) -> bool {
        self.spans.iter().all(|(_, inner)| inner.is_none())
    }

    /// Rows the reader returns for the run.
    pub fn span_rows(&self) -> usize {
        self.spans.iter().fold(0usize, |acc, (n, _)| acc.saturating_add(*n))
    }

    /// Selected rows among the reader's first `read` rows.
    fn selected_before(&self, read: usize) -> usize {
        let (mut left, mut selected) = (read, 0usize);
        for (len, inner) in &self.spans {
            let take = (*len).min(left);
            selected += match inner {
                None => take,
                Some(selectors) => {
                    let mut pos = 0usize;
                    let mut n = 0usize;
                    for s in selectors {
                        let end = (pos + s.row_count).min(take);
                        if !s.skip && pos < end {
                            n += end - pos;
                        }
                        pos += s.row_count;
                    }
                    n
                }
            };
            left -= take;
            if left == 0 {
                break;
            }
        }
        selected
    }
}

/// Walks a run's batches through its spans: which rows of each batch the
/// scan keeps.
pub(crate) struct SpanCursor<'a> {
    spans: &'a [(usize, Option<Vec<RowSelector>>)],
    /// The span being walked, and the rows of it already seen.
    unit: usize,
    seen: usize,
}

impl<'a> SpanCursor<'a> {
    /// A cursor at the start of `spans`.
    pub fn new(spans: &'a [(usize, Option<Vec<RowSelector>>)]) -> SpanCursor<'a> {
        SpanCursor { spans, unit: 0, seen: 0 }
    }

    /// The slices of `batch` (the reader's next rows) the scan keeps.
    fn keep(&mut self, batch: &RecordBatch) -> Vec<RecordBatch> {
        self.keep_ranges(batch.num_rows()).into_iter().map(|r| batch.slice(r.start, r.len())).collect()
    }

    /// The rows of the reader's next `n` the scan keeps, as ranges.
    pub fn keep_ranges(&mut self, n: usize) -> Vec<std::ops::Range<usize>> {
        let mut out = Vec::new();
        let mut at = 0usize;
        while at < n && self.unit < self.spans.len() {
            let (len, inner) = &self.spans[self.unit];
            let take = (len - self.seen).min(n - at);
            match inner {
                None => out.push(at..at + take),
                Some(selectors) => {
                    // The selected parts of span rows [seen, seen + take).
                    let (mut pos, lo, hi) = (0usize, self.seen, self.seen + take);
                    for s in selectors {
                        let (a, b) = (pos.max(lo), (pos + s.row_count).min(hi));
                        if !s.skip && a < b {
                            out.push(at + a - lo..at + b - lo);
                        }
                        pos += s.row_count;
                    }
                }
            }
            at += take;
            self.seen += take;
            if self.seen == *len {
                self.unit += 1;
                self.seen = 0;
            }
        }
        out
    }
}

/// Reads `units` (consecutive row groups of one file) on the device and
/// sends their batches. Returns whether the device is unusable for the rest
/// of the partition (it lost its context and could not be reset).
///
/// A read that loses the GPU context is finished on the CPU (logged,
/// counted in `gpu_context_lost_fallbacks`) from the first row the device
/// did not send. A read the GPU cannot decode goes to the CPU the same way
/// when [`GpqTableOptions::gpu_fallback`](crate::GpqTableOptions::gpu_fallback)
/// allows. Any other error, above all one that is the file's fault, fails
/// the scan.
fn read_on_device(scan: &PartitionScan, units: &[ScanUnit], sink: &mut Sink) -> Result<bool> {
    let Some(first) = units.first() else {
        return Ok(false);
    };
    let file = scan.files.get(first.file).ok_or_else(|| {
        DataFusionError::Internal(format!("gpq scan: no file {} in the table", first.file))
    })?;
    let (roots, positions) = read_layout(file, &scan.read_columns);
    let spans = RunSpans::new(units);
    let wanted: usize = units.iter().fold(0usize, |acc, u| acc.saturating_add(u.rows));
    let limit = scan.reader_limit(sink);
    // Rows sent to the sink, and whether the sink wanted no more.
    let (mut sent, mut stopped) = (0usize, false);
    // Reader rows whose kept rows the sink has (before the scan's filters).
    let mut consumed = 0usize;
    // Late materialization, where it applies (see the `late` module); its
    // progress is where a CPU read takes over if it fails.
    let late = match &scan.filter {
        Some(filter) if scan.options.late_materialization => LatePlan::new(scan, filter).map(|plan| (filter, plan)),
        _ => None,
    };
    let mut late_progress = LateProgress::default();
    let mut late_active = late.is_some();
    let result = (|| -> gpq::Result<()> {
        if let Some((filter, plan)) = &late {
            if read_late(scan, file, units, &spans, filter, plan, sink, &mut late_progress)? {
                return Ok(());
            }
            late_active = false;
        }
        let limit = limit.filter(|_| spans.exact());
        let mut reader = reader(scan, file, &roots, units, spans.selection.as_ref(), limit)?;
        let mut cursor = SpanCursor::new(&spans.spans);
        let mut read = 0usize;
        loop {
            injected_fault(scan)?;
            let Some(table) = reader.next() else { break };
            let table = table?;
            read = read.saturating_add(table.num_rows());
            if read > spans.span_rows() {
                return Err(Error::Internal(format!(
                    "device read of {} returned more than the {} rows it was asked for",
                    file.path.display(),
                    spans.span_rows()
                )));
            }
            let pieces = match &scan.filter {
                Some(filter) => {
                    let within = cursor.keep_ranges(table.num_rows());
                    let whole = within.len() == 1 && within[0] == (0..table.num_rows());
                    vec![filtered_on_device(scan, filter, table, &positions, (!whole).then_some(&within[..]))?]
                }
                None => {
                    let batch = copy_to_host(scan, table)?;
                    let batch = conform(&batch, &positions, &scan.schema).map_err(|e| Error::Internal(e.to_string()))?;
                    cursor.keep(&batch)
                }
            };
            sent += pieces.iter().map(RecordBatch::num_rows).sum::<usize>();
            if !sink.send(pieces) {
                stopped = true;
                break;
            }
            consumed = read;
        }
        if scan.filter.is_some() {
            // Every row of every span was read (the filter keeps what it keeps).
            if !stopped && read != spans.span_rows() {
                return Err(Error::Internal(format!(
                    "device read of {} returned {read} of the {} rows of its spans",
                    file.path.display(),
                    spans.span_rows()
                )));
            }
            return Ok(());
        }
        // Every wanted row came (up to the limit), no fewer.
        let expected = limit.map_or(wanted, |l| l.min(wanted));
        if !stopped && sent != expected {
            return Err(Error::Internal(format!(
                "device read of {} returned {sent} of the {expected} rows selected",
                file.path.display()
            )));
        }
        Ok(())
    })();
    // Where a CPU read takes over: the selected rows the sink has (with the
    // scan's filters, those of the reader rows consumed, however many passed).
    let resume = if late_active {
        spans.selected_before(late_progress.consumed)
    } else if scan.filter.is_some() {
        spans.selected_before(consumed)
    } else {
        sent
    };
    match result {
        Ok(()) => Ok(false),
        Err(e) if falls_back_to_cpu(&e) => {
            let gone = !matches!(e, Error::GpuContextLost { recovered: true, .. });
            warn!(
                file = %file.path.display(),
                row_groups = units.len(),
                rows_sent = sent,
                error = %e,
                "GPU context lost during a device read, finishing it on the CPU{}",
                if gone { " (and the rest of the partition: the device could not be reset)" } else { "" }
            );
            scan.metrics.gpu_context_lost_fallbacks.add(1);
            read_run(scan, units, resume, sink)?;
            Ok(gone)
        }
        Err(e @ Error::Unsupported { .. }) if scan.options.gpu_fallback => {
            warn!(file = %file.path.display(), row_groups = units.len(), rows_sent = sent, "GPU cannot decode this read, decoding on the CPU: {e}");
            scan.metrics.gpu_fallback_row_groups.add(units.len());
            read_run(scan, units, resume, sink)?;
            Ok(false)
        }
        Err(e) => Err(to_df_error(e)),
    }
}

/// Fails as if the GPU context were lost when the scan's tests injected
/// such a fault for this pass.
pub(crate) fn injected_fault(scan: &PartitionScan) -> gpq::Result<()> {
    if scan.take_injected_fault() {
        return Err(Error::GpuContextLost {
            device: scan.device,
            call: "injected fault",
            detail: "a context loss injected for tests (GpqTableOptions::inject_gpu_context_loss)".into(),
            recovered: true,
        });
    }
    Ok(())
}

/// The batch reader of `units` (row groups of `file`): the top-level fields
/// `roots`, the rows `selection` selects of those row groups (`None`: all),
/// and at most `limit` rows.
pub(crate) fn reader(
    scan: &PartitionScan,
    file: &GpqFile,
    roots: &[usize],
    units: &[ScanUnit],
    selection: Option<&RowSelection>,
    limit: Option<usize>,
) -> gpq::Result<gpq::DeviceBatchReader> {
    let options = scan
        .options
        .read
        .clone()
        .with_device(scan.device)
        .with_string_views(file.views)
        .with_columns(roots.iter().map(|&r| ColumnSelector::Index(r)))
        .with_row_groups(units.iter().map(|u| u.row_group));
    let mut builder = DeviceReaderBuilder::new_with_footer(&file.path, file.footer.clone())
        .with_options(options)
        .with_pass_bytes(scan.options.gpu_read_bytes)
        .with_decode_ahead(DECODE_AHEAD);
    if let Some(selection) = selection {
        builder = builder.with_row_selection(selection.clone());
    }
    if let Some(limit) = limit {
        builder = builder.with_limit(limit);
    }
    builder.build()
}

/// Filters a decoded batch (of the read columns, at `positions` among the
/// table's) on the device and copies the output columns' kept rows to the
/// host; a batch the device cannot filter is copied whole and filtered on
/// the host.
fn filtered_on_device(
    scan: &PartitionScan,
    filter: &ScanFilter,
    table: DeviceTable,
    positions: &[usize],
    within: Option<&[std::ops::Range<usize>]>,
) -> gpq::Result<RecordBatch> {
    let predicate = filter.device.map_columns(&|j| positions.get(j).copied().unwrap_or(usize::MAX));
    let keep = &positions[..scan.columns.len().min(positions.len())];
    let m = &scan.metrics;
    match table.filter_columns_within(&predicate, keep, within) {
        Ok(kept) => {
            if let Some(f) = &kept.stats().filter {
                m.device_filter_rows_in.add(f.rows_in);
                m.device_filter_rows_out.add(f.rows_out);
                m.device_filter_time.add_duration(f.time);
            }
            drop(table);
            let batch = copy_to_host(scan, kept)?;
            let identity: Vec<usize> = (0..scan.columns.len()).collect();
            conform(&batch, &identity, &scan.schema).map_err(|e| Error::Internal(e.to_string()))
        }
        Err(Error::Filter(why)) => {
            debug!(%why, "gpq scan filters a batch on the host");
            m.device_filter_fallbacks.add(1);
            let batch = copy_to_host(scan, table)?;
            let batch = conform(&batch, positions, &scan.read_schema).map_err(|e| Error::Internal(e.to_string()))?;
            // The span's selected rows only, then the filters.
            let batch = match within {
                None => batch,
                Some(ranges) => {
                    let pieces: Vec<RecordBatch> = ranges.iter().map(|r| batch.slice(r.start, r.len())).collect();
                    arrow::compute::concat_batches(&batch.schema(), &pieces).map_err(|e| Error::Internal(e.to_string()))?
                }
            };
            scan.finish_on_host(batch).map_err(|e| Error::Internal(e.to_string()))
        }
        Err(e) => Err(e),
    }
}

/// Copies a decoded batch to the host, recording the read's metrics.
pub(crate) fn copy_to_host(scan: &PartitionScan, table: DeviceTable) -> gpq::Result<RecordBatch> {
    record_read(scan, table.stats());
    let m = &scan.metrics;
    let t0 = Instant::now();
    m.bytes_to_host.add(usize::try_from(table.host_copy_bytes()).unwrap_or(usize::MAX));
    let (batch, pinned) = table.to_record_batch_staged()?;
    drop(table);
    m.copy_time.add_elapsed(t0);
    if !pinned {
        m.pageable_copies.add(1);
    }
    Ok(batch)
}

/// Records a device read's metrics (its stages' times, bytes and IO path).
pub(crate) fn record_read(scan: &PartitionScan, stats: &gpq::ReadStats) {
    let m = &scan.metrics;
    m.device_reads.add(1);
    m.plan_time.add_duration(stats.plan);
    m.decompress_time.add_duration(stats.decompress);
    m.decode_time.add_duration(stats.page_headers + stats.decode);
    if let Some(io) = &stats.io {
        m.bytes_read.add(usize::try_from(io.bytes_read).unwrap_or(usize::MAX));
        m.io_time.add_duration(io.wall);
        let mut seen = scan.io_paths.lock().unwrap_or_else(|p| p.into_inner());
        if !seen.iter().any(|p| p == io.path.name()) {
            seen.push(io.path.name().to_string());
        }
    }
}

/// Whether a device read that failed with `e` is answered by the CPU: the
/// GPU context was lost, and the file is not at fault.
fn falls_back_to_cpu(e: &Error) -> bool {
    e.is_context_lost() && !e.is_bad_input()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(bytes: u64) -> ScanUnit {
        ScanUnit {
            file: 0,
            row_group: 0,
            rg_rows: 1,
            selection: None,
            rows: 1,
            bytes,
        }
    }

    #[test]
    fn only_a_lost_context_falls_back() {
        let lost = |recovered| Error::GpuContextLost {
            device: 0,
            call: "test",
            detail: String::new(),
            recovered,
        };
        assert!(falls_back_to_cpu(&lost(true)));
        assert!(falls_back_to_cpu(&lost(false)));
        let corrupt = Error::NotParquet {
            file: "x.parquet".into(),
            reason: "test".into(),
        };
        assert!(!falls_back_to_cpu(&corrupt));
        assert!(!falls_back_to_cpu(&Error::Internal("test".into())));
    }

    fn batch(rows: i32) -> RecordBatch {
        use arrow::array::{ArrayRef, Int32Array};
        RecordBatch::try_from_iter([("x", std::sync::Arc::new(Int32Array::from_iter_values(0..rows)) as ArrayRef)]).unwrap()
    }

    fn values(pieces: &[RecordBatch]) -> Vec<i32> {
        use arrow::array::Int32Array;
        pieces.iter().flat_map(|b| b.column(0).as_any().downcast_ref::<Int32Array>().unwrap().values().to_vec()).collect()
    }

    #[test]
    fn spans_read_each_row_group_once_and_cut_on_the_host() {
        // Unit 0: all 100 rows. Unit 1: rows 10..20 and 40..50 of 60. Unit 2: rows 5..15 of 30.
        let mut units = vec![unit(1), unit(1), unit(1)];
        units[0].rg_rows = 100;
        units[1].rg_rows = 60;
        units[1].selection =
            Some(RowSelection::from(vec![RowSelector::skip(10), RowSelector::select(10), RowSelector::skip(20), RowSelector::select(10), RowSelector::skip(10)]));
        units[2].rg_rows = 30;
        units[2].selection = Some(RowSelection::from(vec![RowSelector::skip(5), RowSelector::select(10), RowSelector::skip(15)]));
        let spans = RunSpans::new(&units);
        assert!(!spans.exact());
        // The reader reads one span per row group: 100 + 40 (rows 10..50) + 10 (rows 5..15).
        assert_eq!(spans.span_rows(), 150);
        let reader: Vec<RowSelector> = spans.selection.as_ref().unwrap().iter().copied().collect();
        let total: usize = reader.iter().filter(|s| !s.skip).map(|s| s.row_count).sum();
        assert_eq!(total, 150);
        // Its 150 rows, in batches that cut spans anywhere: the scan keeps 100 + 20 + 10.
        let all = batch(150);
        for cuts in [vec![150], vec![1, 149], vec![100, 15, 16, 19], vec![70, 70, 10]] {
            let mut cursor = SpanCursor::new(&spans.spans);
            let mut got = Vec::new();
            let mut at = 0;
            for n in cuts {
                got.extend(cursor.keep(&all.slice(at, n)));
                at += n;
            }
            let want: Vec<i32> = (0..100).chain(100..110).chain(130..150).collect();
            assert_eq!(values(&got), want);
        }
        // Without selections the spans are the row groups, exact.
        let plain = RunSpans::new(&[unit(1), unit(1)]);
        assert!(plain.exact() && plain.selection.is_none());
    }
}
