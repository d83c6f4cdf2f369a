//! Late materialization for the GPU backend: a run of row groups whose scan
//! has device filters is read in two phases, so that the output columns the
//! filters do not use are decoded only where some row survives.
//!
//! 1. **The filter columns.** A reader over the columns the filters use
//!    (and only those), over the run's spans, as a scan without late
//!    materialization reads them. Each batch's filters are evaluated on the
//!    device into a bitmap of kept rows ([`gpq::DeviceTable::filter_mask`]),
//!    one bit per row copied to the host; the output columns among them
//!    are gathered on the device and their kept rows copied to the host
//!    and held.
//! 2. **The other output columns.** Of each row group, only the rows from
//!    its first survivor to its last are read, by a second reader with that
//!    row selection: with the offset index only the pages that hold them
//!    are read and decoded, and a row group with no survivor is not read at
//!    all. Each batch's kept rows are gathered on the device by the
//!    bitmap's part for them ([`gpq::DeviceTable::take_rows`]), copied to
//!    the host, and joined row for row with the columns held from the first
//!    phase; the joined batches are sent as they are made.
//!
//! It pays where survivors cluster (files sorted or grouped by a filtered
//! column, selective filters the statistics do not catch) and costs little
//! where they do not: the two readers read the same bytes one read would,
//! plus the bitmap both ways. A run is read this way only when the scan has
//! output columns the filters do not use, every output column is flat (the
//! device gathers flat columns only), and the scan has no row limit. Where
//! the device cannot evaluate the filters on a batch (a column decoded as
//! another type), nothing has been sent yet: the run is read again the
//! ordinary way.

use std::cell::Cell;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::array::BooleanBufferBuilder;
use arrow::buffer::BooleanBuffer;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use tracing::debug;

use gpq::Error;

use crate::file::GpqFile;
use crate::filter::ScanFilter;
use crate::device_run::{RunSpans, SpanCursor, copy_to_host, injected_fault, min_cut_bytes, reader, record_read, restriction};
use crate::scan::{PartitionScan, Sink, read_layout};
use crate::units::ScanUnit;

/// Which read columns each phase reads, where they go in the output, and
/// how far a read got.
pub(crate) struct LatePlan {
    filter: Arc<ScanFilter>,
    /// Read-column positions the filters use, sorted.
    filter_cols: Vec<usize>,
    /// Output positions (ascending) of the output columns among `filter_cols`.
    filter_outputs: Vec<usize>,
    /// Output positions (ascending) of the other output columns.
    rest_outputs: Vec<usize>,
    /// The span rows (of the run's spans, in order) whose kept rows the
    /// sink has, for a CPU read to take over from after a failure.
    consumed: Cell<usize>,
}

impl LatePlan {
    /// The plan for `scan`'s filter, or `None` where late materialization
    /// does not apply: every output column is a filter column, some output
    /// column is nested, or the scan has a row limit (the first phase reads
    /// a whole run before any row is sent, where one read can stop early).
    pub fn new(scan: &PartitionScan, filter: &Arc<ScanFilter>) -> Option<LatePlan> {
        let filter_cols = filter.device.columns();
        let outputs = scan.columns.len();
        let (filter_outputs, rest_outputs): (Vec<usize>, Vec<usize>) = (0..outputs).partition(|j| filter_cols.contains(j));
        if rest_outputs.is_empty() || scan.limit.is_some() || scan.schema.fields().iter().any(|f| f.data_type().is_nested()) {
            return None;
        }
        Some(LatePlan { filter: Arc::clone(filter), filter_cols, filter_outputs, rest_outputs, consumed: Cell::new(0) })
    }

    fn table_columns(&self, scan: &PartitionScan, positions: &[usize]) -> Vec<usize> {
        positions.iter().map(|&j| scan.read_columns[j]).collect()
    }
}

impl LatePlan {
    /// The span rows whose kept rows the sink has (see [`LatePlan::read`]).
    pub fn consumed(&self) -> usize {
        self.consumed.get()
    }

    /// Reads `units` in two phases (see the module doc). `Ok(false)`: the
    /// device could not evaluate the filters; nothing was sent, and the run
    /// is to be read the ordinary way.
    pub fn read(&self, scan: &PartitionScan, file: &GpqFile, units: &[ScanUnit], spans: &RunSpans, sink: &mut Sink) -> gpq::Result<bool> {
        self.consumed.set(0);
        read_late(scan, file, units, spans, self, sink)
    }
}

fn read_late(scan: &PartitionScan, file: &GpqFile, units: &[ScanUnit], spans: &RunSpans, plan: &LatePlan, sink: &mut Sink) -> gpq::Result<bool> {
    let filter = &plan.filter;
    // Phase 1: the filter columns, every span row.
    let filter_table_cols = plan.table_columns(scan, &plan.filter_cols);
    let (roots, positions) = read_layout(file, &filter_table_cols);
    let predicate = filter.device.map_columns(&|j| {
        plan.filter_cols.binary_search(&j).ok().map_or(usize::MAX, |k| positions[k])
    });
    let keep: Vec<usize> = plan
        .filter_outputs
        .iter()
        .map(|j| positions[plan.filter_cols.binary_search(j).unwrap_or(0)])
        .collect();
    let mut mask = BooleanBufferBuilder::new(spans.span_rows());
    let mut held: VecDeque<RecordBatch> = VecDeque::new();
    let mut cursor = SpanCursor::new(&spans.spans);
    let first = reader(scan, file, &roots, units, spans.selection.as_ref(), None)?;
    for table in first {
        injected_fault(scan)?;
        let table = table?;
        let within = cursor.keep_ranges(table.num_rows());
        let t0 = Instant::now();
        let kept = match table.filter_mask(&predicate, restriction(&within, table.num_rows())) {
            Ok(kept) => kept,
            Err(Error::Filter(why)) => {
                debug!(%why, "gpq scan: the device cannot filter this run's batches; read without late materialization");
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        let m = &scan.metrics;
        m.bytes_to_host.add(table.num_rows().div_ceil(8));
        m.device_filter_rows_in.add(in_ranges(&within));
        m.device_filter_rows_out.add(kept.count_set_bits());
        if keep.is_empty() {
            m.device_filter_time.add_elapsed(t0);
            record_read(scan, table.stats());
        } else {
            let taken = table.take_rows(&kept, &keep)?;
            m.device_filter_time.add_elapsed(t0);
            drop(table);
            held.push_back(copy_to_host(scan, taken)?);
        }
        mask.append_buffer(&kept);
        if mask.len() > spans.span_rows() {
            return Err(Error::Internal(format!("device read of {} returned more rows than its spans hold", file.path.display())));
        }
    }
    let mask = mask.finish();
    if mask.len() != spans.span_rows() {
        return Err(Error::Internal(format!(
            "device read of {} returned {} of the {} rows of its spans",
            file.path.display(),
            mask.len(),
            spans.span_rows()
        )));
    }

    // Phase 2: the other output columns, of each span only its survivors' rows.
    let second = SecondPhase::new(units, spans, &mask, min_cut_bytes(scan));
    scan.metrics.late_rows_skipped.add(spans.span_rows() - second.rows);
    if second.rows == 0 {
        plan.consumed.set(spans.span_rows());
        return Ok(true);
    }
    let rest_table_cols = plan.table_columns(scan, &plan.rest_outputs);
    let (roots, positions) = read_layout(file, &rest_table_cols);
    let mut at = 0usize;
    let mut joiner = Joiner { plan, held, front: 0 };
    for table in reader(scan, file, &roots, units, Some(&second.selection), None)? {
        injected_fault(scan)?;
        let table = table?;
        let n = table.num_rows();
        if at + n > second.rows {
            return Err(Error::Internal(format!("device read of {} returned more rows than it was asked for", file.path.display())));
        }
        let t0 = Instant::now();
        let taken = table.take_rows(&second.mask.slice(at, n), &positions)?;
        scan.metrics.device_filter_time.add_elapsed(t0);
        drop(table);
        let rest = copy_to_host(scan, taken)?;
        let pieces = joiner.join(scan, rest)?;
        at += n;
        let more = sink.send(pieces);
        plan.consumed.set(second.span_position(at));
        if !more {
            return Ok(true);
        }
    }
    if at != second.rows {
        return Err(Error::Internal(format!("device read of {} returned {at} of the {} rows asked for", file.path.display(), second.rows)));
    }
    plan.consumed.set(spans.span_rows());
    Ok(true)
}

/// Rows in `ranges`.
fn in_ranges(ranges: &[Range<usize>]) -> usize {
    ranges.iter().map(Range::len).sum()
}

/// The second phase's read: of each unit, a window of its row group's rows
/// holding every survivor of its span: from the first survivor to the last,
/// the whole row group, or nothing.
struct SecondPhase {
    /// For the reader, over the units' row groups.
    selection: RowSelection,
    /// The kept rows among the rows read.
    mask: BooleanBuffer,
    /// Rows read.
    rows: usize,
    /// Per window read: its first row among the rows read, its rows in its
    /// row group, and its unit's span (first row in the row group, length,
    /// first row among the span rows).
    parts: Vec<Window>,
}

/// One unit's window of the second phase.
struct Window {
    read_first: usize,
    rows: std::ops::Range<usize>,
    span_start: usize,
    span_len: usize,
    span_base: usize,
}

impl SecondPhase {
    /// The windows of `units` for the survivors in `mask` (over the run's
    /// span rows). As for the spans ([`RunSpans::new`]), a row group is cut
    /// to its survivors, or left out for having none, only where that saves
    /// at least `min_cut_bytes` of its compressed bytes: a cut ends a run of
    /// consecutive rows, and so a pass.
    fn new(units: &[ScanUnit], spans: &RunSpans, mask: &BooleanBuffer, min_cut_bytes: u64) -> SecondPhase {
        let mut selectors = Vec::with_capacity(units.len() * 3);
        let mut parts = Vec::new();
        let mut kept = BooleanBufferBuilder::new(0);
        let (mut base, mut rows) = (0usize, 0usize);
        for (u, (len, start)) in units.iter().zip(spans.spans.iter().map(|(len, _)| *len).zip(spans.starts.iter().copied())) {
            let span = mask.slice(base, len);
            let mut survivors = span.set_indices();
            let survivors = survivors.next().map(|a| (a, survivors.last().unwrap_or(a) + 1));
            let cut = |kept_rows: usize| u128::from(u.bytes) * ((u.rg_rows - kept_rows) as u128) / (u.rg_rows.max(1) as u128) >= u128::from(min_cut_bytes);
            let window = match survivors {
                None if cut(0) => None,
                Some((a, b)) if cut(b - a) => Some(start + a..start + b),
                _ => Some(0..u.rg_rows),
            };
            match window {
                None => selectors.push(RowSelector::skip(u.rg_rows)),
                Some(w) => {
                    selectors.extend([RowSelector::skip(w.start), RowSelector::select(w.len()), RowSelector::skip(u.rg_rows - w.end)]);
                    // The window's bits: the span's where they overlap, unset elsewhere.
                    let (lo, hi) = (w.start.clamp(start, start + len), w.end.clamp(start, start + len));
                    kept.append_n(lo - w.start, false);
                    kept.append_buffer(&span.slice(lo - start, hi - lo));
                    kept.append_n(w.end - hi, false);
                    parts.push(Window { read_first: rows, rows: w.clone(), span_start: start, span_len: len, span_base: base });
                    rows += w.len();
                }
            }
            base += len;
        }
        SecondPhase { selection: RowSelection::from(selectors), mask: kept.finish(), rows, parts }
    }

    /// The span position of the end of the second phase's first `read`
    /// rows: every span row before it has had its kept rows sent.
    fn span_position(&self, read: usize) -> usize {
        let Some(w) = self.parts.iter().rev().find(|w| w.read_first < read) else {
            return 0;
        };
        let row = w.rows.start + (read - w.read_first).min(w.rows.len());
        w.span_base + row.saturating_sub(w.span_start).min(w.span_len)
    }
}

/// Joins the second phase's batches, row for row, with the first phase's
/// held output columns.
struct Joiner<'a> {
    plan: &'a LatePlan,
    held: VecDeque<RecordBatch>,
    /// Rows of the front held batch already joined.
    front: usize,
}

impl Joiner<'_> {
    fn join(&mut self, scan: &PartitionScan, rest: RecordBatch) -> gpq::Result<Vec<RecordBatch>> {
        let internal = |e: arrow::error::ArrowError| Error::Internal(e.to_string());
        if self.plan.filter_outputs.is_empty() {
            return Ok(vec![assemble(scan, self.plan, None, &rest).map_err(internal)?]);
        }
        let mut out = Vec::new();
        let mut at = 0usize;
        while at < rest.num_rows() {
            let Some(front) = self.held.front() else {
                return Err(Error::Internal("late materialization: the two phases kept different row counts".into()));
            };
            let k = (front.num_rows() - self.front).min(rest.num_rows() - at);
            let left = front.slice(self.front, k);
            out.push(assemble(scan, self.plan, Some(&left), &rest.slice(at, k)).map_err(internal)?);
            at += k;
            self.front += k;
            if self.front == front.num_rows() {
                self.held.pop_front();
                self.front = 0;
            }
        }
        Ok(out)
    }
}

/// One output batch from the filter columns' part (`left`, in the order of
/// `plan.filter_outputs`) and the other columns' (`right`).
fn assemble(scan: &PartitionScan, plan: &LatePlan, left: Option<&RecordBatch>, right: &RecordBatch) -> Result<RecordBatch, arrow::error::ArrowError> {
    let mut columns: Vec<Option<ArrayRef>> = vec![None; scan.columns.len()];
    if let Some(left) = left {
        for (k, &j) in plan.filter_outputs.iter().enumerate() {
            columns[j] = Some(Arc::clone(left.column(k)));
        }
    }
    for (k, &j) in plan.rest_outputs.iter().enumerate() {
        columns[j] = Some(Arc::clone(right.column(k)));
    }
    let columns = columns
        .into_iter()
        .zip(scan.schema.fields())
        .map(|(c, field)| {
            let c = c.ok_or_else(|| arrow::error::ArrowError::InvalidArgumentError(format!("no column for {}", field.name())))?;
            if c.data_type() == field.data_type() { Ok(c) } else { arrow::compute::cast(&c, field.data_type()) }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(right.num_rows()));
    RecordBatch::try_new_with_options(Arc::clone(&scan.schema), columns, &options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(rg_rows: usize, selection: Option<RowSelection>) -> ScanUnit {
        ScanUnit { selection, ..ScanUnit::whole(rg_rows, 1) }
    }

    #[test]
    fn the_second_phase_reads_first_to_last_survivor_of_each_span() {
        // Unit 0: all 100 rows; unit 1: span rows 20..60 of 80; unit 2: 50 rows, no survivor.
        let units = vec![
            unit(100, None),
            unit(80, Some(RowSelection::from(vec![RowSelector::skip(20), RowSelector::select(40), RowSelector::skip(20)]))),
            unit(50, None),
        ];
        let spans = RunSpans::new(&units, 0);
        assert_eq!(spans.span_rows(), 190);
        // Survivors: span rows 10, 30, 99 (unit 0), 105 and 110 (unit 1: rows 25 and 30 of its row group).
        let mask: BooleanBuffer = (0..190).map(|i| [10, 30, 99, 105, 110].contains(&i)).collect();
        let second = SecondPhase::new(&units, &spans, &mask, 0);
        assert_eq!(second.rows, 90 + 6);
        let selectors: Vec<RowSelector> = second.selection.iter().copied().filter(|s| s.row_count > 0).collect();
        assert_eq!(
            selectors,
            vec![
                RowSelector::skip(10),
                RowSelector::select(90),
                RowSelector::skip(25),
                RowSelector::select(6),
                RowSelector::skip(49 + 50)
            ]
        );
        let kept: Vec<usize> = second.mask.set_indices().collect();
        assert_eq!(kept, vec![0, 20, 89, 90, 95]);
        // Span positions: nothing read, inside unit 0's part, at its end, inside unit 1's, the end.
        assert_eq!(second.span_position(0), 0);
        assert_eq!(second.span_position(50), 60);
        assert_eq!(second.span_position(90), 100);
        assert_eq!(second.span_position(93), 108);
        assert_eq!(second.span_position(96), 111);

        // Where cutting saves fewer bytes than the threshold, whole row
        // groups are read (one run): unit 0 and 1 whole, unit 2 too.
        let whole = SecondPhase::new(&units, &spans, &mask, 2);
        assert_eq!(whole.rows, 230);
        assert_eq!(whole.selection.iter().filter(|s| s.skip && s.row_count > 0).count(), 0);
        let kept: Vec<usize> = whole.mask.set_indices().collect();
        // Unit 1's span starts at its row 20: survivors 105 and 110 are its rows 25 and 30.
        assert_eq!(kept, vec![10, 30, 99, 125, 130]);
        assert_eq!(whole.span_position(100), 100);
        assert_eq!(whole.span_position(110), 100);
        assert_eq!(whole.span_position(126), 106);
        assert_eq!(whole.span_position(170), 140);
        assert_eq!(whole.span_position(230), 190);
    }
}
