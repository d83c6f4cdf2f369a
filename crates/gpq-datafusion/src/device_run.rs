//! Reading one run of a partition's row groups (consecutive row groups of
//! one file) on the device, as both GPU paths do it: the one-read path of
//! the `gpu` module and the two phases of `late`. The run's spans (of each
//! row group, its first to its last selected row) and the cursor that cuts
//! batches to the rows the page index keeps, the batch reader over them,
//! the host copy with its metrics, and the tests' injected faults.

use std::time::Instant;

use arrow::array::RecordBatch;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};

use gpq::{ColumnSelector, DeviceReaderBuilder, DeviceTable, Error};

use crate::file::GpqFile;
use crate::scan::PartitionScan;
use crate::units::ScanUnit;

/// Passes one partition's reader decodes at once. One: the partitions
/// already keep the device busy together, and each pass in flight holds its
/// own device memory (the reader still reads the next pass's chunks while
/// the current one decodes).
pub(crate) const DECODE_AHEAD: usize = 1;

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
    /// The spans of `units`. A row group is cut to its span only where the
    /// rows cut away hold at least `min_cut_bytes` of its projected
    /// compressed bytes (by their share of its rows); otherwise it is read
    /// whole and the page index's rows are cut after decoding. A cut row
    /// group ends the reader's run of consecutive rows, and each run is read
    /// in passes of its own: cutting a few pages off small row groups (TPC-H
    /// SF10 lineitem has 1,047 of 7 MiB) made every row group a pass, whose
    /// fixed cost far exceeds decoding the pages it saved.
    pub fn new(units: &[ScanUnit], min_cut_bytes: u64) -> RunSpans {
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
            let mut first = first.unwrap_or(0).min(u.rg_rows);
            let mut end = end.clamp(first, u.rg_rows);
            let cut_rows = (u.rg_rows - (end - first)) as u128;
            let cut_bytes = u128::from(u.bytes) * cut_rows / (u.rg_rows.max(1) as u128);
            if cut_bytes < u128::from(min_cut_bytes) {
                (first, end) = (0, u.rg_rows);
            }
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
    pub fn exact(&self) -> bool {
        self.spans.iter().all(|(_, inner)| inner.is_none())
    }

    /// Rows the reader returns for the run.
    pub fn span_rows(&self) -> usize {
        self.spans.iter().fold(0usize, |acc, (n, _)| acc.saturating_add(*n))
    }

    /// Selected rows among the reader's first `read` rows.
    pub fn selected_before(&self, read: usize) -> usize {
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

/// Smallest pass [`pass_bytes`] makes, whatever the run's size: below this a
/// pass's fixed cost outweighs the overlap it buys.
pub(crate) const MIN_PASS_BYTES: u64 = 8 << 20;

/// Projected compressed bytes per pass of the reader of `units`: `max`
/// (the table's [`gpu_read_bytes`](crate::GpqTableOptions::gpu_read_bytes))
/// at most, but small enough that the run takes `passes` (the table's
/// [`gpu_min_passes`](crate::GpqTableOptions::gpu_min_passes)), none under
/// [`MIN_PASS_BYTES`].
///
/// A partition of one pass cannot overlap anything: the device decodes,
/// filters and copies all of it while DataFusion waits, and then DataFusion
/// works while the device idles. TPC-H SF10 q1 reads 39 MiB per partition
/// at 16 partitions, one 64 MiB pass each before this; in passes of about
/// 10 MiB the consumer aggregates one while the device decodes the next.
pub(crate) fn pass_bytes(max: u64, passes: u64, units: &[ScanUnit]) -> u64 {
    let run: u64 = units.iter().fold(0u64, |acc, u| acc.saturating_add(u.bytes));
    run.div_ceil(passes.max(1)).max(MIN_PASS_BYTES).min(max.max(1))
}

/// Compressed bytes below which a row group is not cut to its rows (see
/// [`RunSpans::new`]): half a pass.
pub(crate) fn min_cut_bytes(scan: &PartitionScan) -> u64 {
    scan.options.gpu_read_bytes / 2
}

/// `within` (the kept rows of a batch of `n`, from [`SpanCursor::keep_ranges`])
/// as a device filter's restriction: `None` when it is every row.
pub(crate) fn restriction(within: &[std::ops::Range<usize>], n: usize) -> Option<&[std::ops::Range<usize>]> {
    (!(within.len() == 1 && within[0] == (0..n))).then_some(within)
}

/// The slices of `chunk` (rows `at..` of a batch) inside `keep` (ranges of
/// the batch's rows, ascending, as [`SpanCursor::keep_ranges`] gives them).
pub(crate) fn slices_within(chunk: &RecordBatch, at: usize, keep: &[std::ops::Range<usize>]) -> Vec<RecordBatch> {
    let end = at + chunk.num_rows();
    keep.iter()
        .filter_map(|r| {
            let (a, b) = (r.start.max(at), r.end.min(end));
            (a < b).then(|| chunk.slice(a - at, b - a))
        })
        .collect()
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
    #[cfg(test)]
    pub fn keep(&mut self, batch: &RecordBatch) -> Vec<RecordBatch> {
        let ranges = self.keep_ranges(batch.num_rows());
        slices_within(batch, 0, &ranges)
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
        .with_pass_bytes(pass_bytes(scan.options.gpu_read_bytes, scan.options.gpu_min_passes, units))
        .with_decode_ahead(DECODE_AHEAD);
    if let Some(selection) = selection {
        builder = builder.with_row_selection(selection.clone());
    }
    if let Some(limit) = limit {
        builder = builder.with_limit(limit);
    }
    builder.build()
}

/// Host bytes per chunk of a staged copy ([`stage_to_host`]): DataFusion
/// gets each chunk of a batch as soon as it lands, and works on it while
/// the next ones cross the bus.
pub(crate) const HOST_CHUNK_BYTES: u64 = 32 << 20;

/// Queues a decoded batch's copy to the host in chunks
/// ([`DeviceTable::into_staged_batches`]), recording the read's metrics;
/// the caller adds the time it waits for each chunk to `copy_time`.
pub(crate) fn stage_to_host(scan: &PartitionScan, table: DeviceTable) -> gpq::Result<gpq::arrow::StagedBatches> {
    record_read(scan, table.stats());
    let m = &scan.metrics;
    let t0 = Instant::now();
    let bytes = table.host_copy_bytes();
    m.bytes_to_host.add(usize::try_from(bytes).unwrap_or(usize::MAX));
    // Never under a DataFusion batch: the stream cuts those from the chunks.
    let chunk = table.staged_chunk_rows(HOST_CHUNK_BYTES).max(scan.batch_size);
    let staged = table.into_staged_batches(chunk)?;
    m.copy_time.add_elapsed(t0);
    if !staged.pinned() {
        m.pageable_copies.add(1);
    }
    Ok(staged)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(bytes: u64) -> ScanUnit {
        ScanUnit::whole(1, bytes)
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
    fn runs_take_several_passes_where_their_bytes_allow() {
        const MIB: u64 = 1 << 20;
        let run = |mib: &[u64]| mib.iter().map(|&m| unit(m * MIB)).collect::<Vec<_>>();
        // TPC-H SF10 q1 at 16 partitions: 39 MiB a partition, four passes.
        assert_eq!(pass_bytes(64 * MIB, 4, &run(&[13, 13, 13])), (39 * MIB).div_ceil(4));
        // One pass asked for: the whole run in one, as before passes were cut.
        assert_eq!(pass_bytes(64 * MIB, 1, &run(&[13, 13, 13])), 39 * MIB);
        assert_eq!(pass_bytes(64 * MIB, 1, &run(&[60, 60])), 64 * MIB);
        // Small runs: no pass under the floor (one pass for the whole run).
        assert_eq!(pass_bytes(64 * MIB, 4, &run(&[3, 3])), MIN_PASS_BYTES);
        // Large runs: the table's pass size.
        assert_eq!(pass_bytes(64 * MIB, 4, &run(&[600, 600])), 64 * MIB);
        // A table asking for smaller passes than the floor gets them.
        assert_eq!(pass_bytes(MIB, 4, &run(&[40])), MIB);
        assert_eq!(pass_bytes(0, 0, &run(&[40])), 1);
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
        let spans = RunSpans::new(&units, 0);
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
        // Where cutting saves fewer bytes than asked, every row group is read
        // whole (one run of rows for the reader) and still cut after decoding.
        let whole = RunSpans::new(&units, 2);
        assert_eq!(whole.span_rows(), 190);
        assert!(whole.selection.as_ref().unwrap().iter().all(|s| !s.skip || s.row_count == 0));
        let mut cursor = SpanCursor::new(&whole.spans);
        let want: Vec<i32> = (0..100).chain(110..120).chain(140..150).chain(165..175).collect();
        assert_eq!(values(&cursor.keep(&batch(190))), want);
        // Without selections the spans are the row groups, exact.
        let plain = RunSpans::new(&[unit(1), unit(1)], 0);
        assert!(plain.exact() && plain.selection.is_none());
    }
}
