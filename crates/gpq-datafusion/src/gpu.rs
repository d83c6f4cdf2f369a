//! The GPU backend: each run of a partition's row groups in one file is read
//! by gpq's batch reader ([`gpq::DeviceReaderBuilder`]), and each of its
//! batches copied to the host through pinned memory in chunks of rows
//! ([`gpq::DeviceTable::into_staged_batches`], about 32 MiB each), each
//! chunk handed to DataFusion as soon as it lands, so DataFusion works on a
//! batch's first rows while the rest are on their way.
//!
//! The reader cuts the run into passes of whole row groups of at most
//! [`GpqTableOptions::gpu_read_bytes`](crate::GpqTableOptions::gpu_read_bytes)
//! of projected compressed bytes, at least
//! [`gpu_min_passes`](crate::GpqTableOptions::gpu_min_passes) of them where
//! the run is large enough, and reads the next pass while the device
//! decodes the current one and DataFusion consumes the one before. With
//! the page index's row selections it reads
//! and decodes, of a row group, only the pages of its span (its first to
//! its last selected row), cut on the device, where the rows cut away hold
//! at least half a pass of compressed bytes; pages before and after the
//! span then cost neither IO nor decode time. (A cut row group ends a run
//! of consecutive rows, and so a pass: smaller cuts cost more than they
//! save, and such row groups are read whole.) Each row group is read once, however
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
//! not be reset, the rest of the partition decodes on the CPU too. (Except
//! where a device-filtered batch fails after some of its chunks went to
//! DataFusion: its sent rows cannot be told from the others, so the scan
//! fails rather than send them twice.) A device read that returns other
//! than the rows selected is an error.
//! Errors that are the file's fault ([`gpq::Error::is_bad_input`]) still fail
//! the query: corrupt data never falls back silently.

use arrow::array::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use tracing::{debug, warn};

use gpq::arrow::StagedBatches;
use gpq::{DeviceTable, Error};

use crate::cpu::read_run;
use crate::filter::ScanFilter;
use crate::device_run::{RunSpans, SpanCursor, copy_to_host, injected_fault, min_cut_bytes, reader, restriction, slices_within, stage_to_host};
use crate::late::LatePlan;
use crate::scan::{Decoder, PartitionScan, Sink, conform, file_runs, read_layout};
use crate::to_df_error;
use crate::units::ScanUnit;

/// gpq on the GPU.
#[derive(Debug)]
pub(crate) struct GpuDecoder;

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
    let spans = RunSpans::new(units, min_cut_bytes(scan));
    let wanted: usize = units.iter().fold(0usize, |acc, u| acc.saturating_add(u.rows));
    let limit = scan.reader_limit(sink);
    // Rows sent to the sink, and whether the sink wanted no more.
    let (mut sent, mut stopped) = (0usize, false);
    // Reader rows whose kept rows the sink has (before the scan's filters).
    let mut consumed = 0usize;
    // Late materialization, where it applies (see the `late` module); its
    // progress is where a CPU read takes over if it fails.
    let late = match &scan.filter {
        Some(filter) if scan.options.late_materialization && scan.aggregate.is_none() => LatePlan::new(scan, filter),
        _ => None,
    };
    let mut late_active = late.is_some();
    // Set when a device-filtered batch failed after part of it was sent:
    // no CPU read can take over without repeating those rows.
    let mut cannot_resume = false;
    let result = (|| -> gpq::Result<()> {
        if let Some(plan) = &late {
            if plan.read(scan, file, units, &spans, sink)? {
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
            match &scan.filter {
                Some(filter) => {
                    let within = cursor.keep_ranges(table.num_rows());
                    let within = restriction(&within, table.num_rows());
                    match filtered_on_device(scan, filter, table, &positions, within)? {
                        Filtered::Aggregated(rows) => {
                            sent += rows;
                            if scan.aggregate.as_ref().is_some_and(|a| a.closed()) {
                                stopped = true;
                                break;
                            }
                        }
                        Filtered::OnHost(batch) => {
                            sent += batch.num_rows();
                            if !sink.send(vec![batch]) {
                                stopped = true;
                                break;
                            }
                        }
                        Filtered::OnDevice(mut staged) => {
                            let identity: Vec<usize> = (0..scan.columns.len()).collect();
                            let mut partly_sent = false;
                            while let Some(chunk) = next_chunk(scan, &mut staged) {
                                // A CPU read could only take over from this batch's first
                                // row, and its first chunks are already sent.
                                let chunk = chunk.inspect_err(|_| cannot_resume = partly_sent)?;
                                let chunk = conform(&chunk, &identity, &scan.schema).map_err(|e| Error::Internal(e.to_string()))?;
                                sent += chunk.num_rows();
                                partly_sent = true;
                                if !sink.send(vec![chunk]) {
                                    stopped = true;
                                    break;
                                }
                            }
                        }
                    }
                }
                None => {
                    let n = table.num_rows();
                    let keep = cursor.keep_ranges(n);
                    if let Some(agg) = &scan.aggregate
                        && let Some(rows) = agg.try_aggregate(&scan.metrics.aggregate, &table, Some(&positions), restriction(&keep, n))?
                    {
                        sent += rows;
                        if agg.closed() {
                            stopped = true;
                            break;
                        }
                    } else {
                        let mut staged = stage_to_host(scan, table)?;
                        let mut at = 0usize;
                        while let Some(chunk) = next_chunk(scan, &mut staged) {
                            let chunk = conform(&chunk?, &positions, &scan.schema).map_err(|e| Error::Internal(e.to_string()))?;
                            let pieces = slices_within(&chunk, at, &keep);
                            at += chunk.num_rows();
                            sent += pieces.iter().map(RecordBatch::num_rows).sum::<usize>();
                            if !sink.send(pieces) {
                                stopped = true;
                                break;
                            }
                        }
                    }
                }
            }
            if stopped {
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
        spans.selected_before(late.as_ref().map_or(0, LatePlan::consumed))
    } else if scan.filter.is_some() {
        spans.selected_before(consumed)
    } else {
        sent
    };
    match result {
        Ok(()) => Ok(false),
        Err(e) if cannot_resume => {
            warn!(
                file = %file.path.display(),
                rows_sent = sent,
                error = %e,
                "copying device-filtered rows to the host failed after part of them went to DataFusion; \
                 a CPU read cannot take over without repeating them, so the scan fails"
            );
            Err(to_df_error(e))
        }
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

/// A decoded batch after the scan's filters.
enum Filtered {
    /// Aggregated on the device (see the `aggregate` module): the rows it took.
    Aggregated(usize),
    /// Filtered on the device: its kept rows on their way to the host, in chunks.
    OnDevice(StagedBatches),
    /// Copied whole and filtered on the host (the device could not filter it).
    OnHost(RecordBatch),
}

/// Filters a decoded batch (of the read columns, at `positions` among the
/// table's) on the device and queues the copy of the output columns' kept
/// rows to the host; a batch the device cannot filter is copied whole and
/// filtered on the host.
fn filtered_on_device(
    scan: &PartitionScan,
    filter: &ScanFilter,
    table: DeviceTable,
    positions: &[usize],
    within: Option<&[std::ops::Range<usize>]>,
) -> gpq::Result<Filtered> {
    let predicate = filter.device.map_columns(&|j| positions.get(j).copied().unwrap_or(usize::MAX));
    if let Some(agg) = &scan.aggregate
        && let Some(rows) = agg.try_filter_aggregate(&scan.metrics.aggregate, &table, &predicate, positions, within)?
    {
        scan.metrics.device_filter_rows_in.add(within.map_or(table.num_rows(), |r| r.iter().map(|r| r.len()).sum()));
        scan.metrics.device_filter_rows_out.add(rows);
        return Ok(Filtered::Aggregated(rows));
    }
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
            Ok(Filtered::OnDevice(stage_to_host(scan, kept)?))
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
            Ok(Filtered::OnHost(scan.finish_on_host(batch).map_err(|e| Error::Internal(e.to_string()))?))
        }
        Err(e) => Err(e),
    }
}

/// The next chunk of a staged copy, its wait counted in `copy_time`.
fn next_chunk(scan: &PartitionScan, staged: &mut StagedBatches) -> Option<gpq::Result<RecordBatch>> {
    let t0 = std::time::Instant::now();
    let chunk = staged.next();
    scan.metrics.copy_time.add_elapsed(t0);
    chunk
}

/// Whether a device read that failed with `e` is answered by the CPU: the
/// GPU context was lost, and the file is not at fault.
fn falls_back_to_cpu(e: &Error) -> bool {
    e.is_context_lost() && !e.is_bad_input()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
