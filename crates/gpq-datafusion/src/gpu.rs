//! The GPU backend: each run of a partition's row groups in one file is read
//! by gpq's batch reader ([`gpq::DeviceReaderBuilder`]), and each of its
//! batches copied to the host through pinned memory
//! ([`gpq::DeviceTable::to_record_batch_staged`]).
//!
//! The reader cuts the run into passes of whole row groups of about
//! [`GpqTableOptions::gpu_read_bytes`](crate::GpqTableOptions::gpu_read_bytes)
//! of projected compressed bytes, reads the next pass while the device
//! decodes the current one, and, given the page index's row selections,
//! reads and decodes only the pages that hold selected rows, cut on the
//! device: pruned pages cost neither IO nor decode time. A scan's row limit
//! goes to the reader too, so the last pages it would not need stay unread.
//!
//! What the GPU cannot decode (an `Unsupported` error, raised before any IO)
//! is decoded on the CPU when fallback is allowed, logged and counted. A read
//! that loses the GPU context ([`gpq::Error::is_context_lost`]) is finished on
//! the CPU instead of failing the query (the rows already sent are not sent
//! again), logged and counted (`gpu_context_lost_fallbacks`); when the device
//! could not be reset, the rest of the partition decodes on the CPU too.
//! Errors that are the file's fault ([`gpq::Error::is_bad_input`]) still fail
//! the query: corrupt data never falls back silently.

use std::time::Instant;

use arrow::array::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use tracing::warn;

use gpq::{ColumnSelector, DeviceReaderBuilder, DeviceTable, Error};

use crate::cpu::read_run;
use crate::file::GpqFile;
use crate::scan::{Decoder, PartitionScan, Sink, conform, file_runs, read_layout};
use crate::to_df_error;
use crate::units::ScanUnit;

/// gpq on the GPU.
#[derive(Debug)]
pub(crate) struct GpuDecoder;

/// Passes one partition's reader decodes at once: the partitions already
/// share the device, and each pass in flight holds its own memory.
const DECODE_AHEAD: usize = 2;

impl Decoder for GpuDecoder {
    fn produce(&self, scan: &PartitionScan, sink: &mut Sink) -> Result<()> {
        // Set when the device lost its context and could not get a fresh one:
        // the rest of the partition decodes on the CPU.
        let mut device_gone = false;
        for run in file_runs(&scan.units) {
            if device_gone {
                scan.metrics.gpu_context_lost_fallbacks.add(1);
                read_run(scan, run, sink)?;
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

/// The rows of `units` (consecutive row groups of one file) the scan wants,
/// as one selection over those row groups; `None` when it wants all.
fn run_selection(units: &[ScanUnit]) -> Option<RowSelection> {
    if units.iter().all(|u| u.selection.is_none()) {
        return None;
    }
    let mut selectors: Vec<RowSelector> = Vec::new();
    for u in units {
        match &u.selection {
            Some(s) => selectors.extend(s.iter().copied()),
            None => selectors.push(RowSelector::select(u.rg_rows)),
        }
    }
    Some(RowSelection::from(selectors))
}

/// Reads `units` (consecutive row groups of one file) on the device and
/// sends their batches. Returns whether the device is unusable for the rest
/// of the partition (it lost its context and could not be reset).
///
/// A read that loses the GPU context is finished on the CPU (logged,
/// counted in `gpu_context_lost_fallbacks`), skipping the rows the device
/// already sent. A read the GPU cannot decode goes to the CPU the same way
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
    let (roots, positions) = read_layout(file, &scan.columns);
    let wanted: usize = units.iter().fold(0usize, |acc, u| acc.saturating_add(u.rows));
    let mut sent = 0usize;
    let result = (|| -> gpq::Result<()> {
        let mut reader = reader(scan, file, &roots, units, sink.remaining())?;
        for batch in reader.by_ref() {
            let table = batch?;
            let batch = copy_to_host(scan, table)?;
            if sent.saturating_add(batch.num_rows()) > wanted {
                return Err(Error::Internal(format!(
                    "device read of {} returned more than the {wanted} rows selected",
                    file.path.display()
                )));
            }
            sent += batch.num_rows();
            let batch = conform(&batch, &positions, &scan.schema).map_err(|e| Error::Internal(e.to_string()))?;
            if !sink.send(vec![batch]) {
                break;
            }
        }
        Ok(())
    })();
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
            sink.skip(sent);
            read_run(scan, units, sink)?;
            Ok(gone)
        }
        Err(e @ Error::Unsupported { .. }) if scan.options.gpu_fallback => {
            warn!(file = %file.path.display(), row_groups = units.len(), "GPU cannot decode this read, decoding on the CPU: {e}");
            scan.metrics.gpu_fallback_row_groups.add(units.len());
            sink.skip(sent);
            read_run(scan, units, sink)?;
            Ok(false)
        }
        Err(e) => Err(to_df_error(e)),
    }
}

/// The batch reader of `units` (row groups of `file`): the top-level fields
/// `roots`, the page index's selections, at most `limit` rows.
fn reader(
    scan: &PartitionScan,
    file: &GpqFile,
    roots: &[usize],
    units: &[ScanUnit],
    limit: Option<usize>,
) -> gpq::Result<gpq::DeviceBatchReader> {
    let options = scan
        .options
        .read
        .clone()
        .with_columns(roots.iter().map(|&r| ColumnSelector::Index(r)))
        .with_row_groups(units.iter().map(|u| u.row_group));
    if scan.take_injected_fault() {
        return Err(Error::GpuContextLost {
            device: options.device,
            call: "injected fault",
            detail: "a context loss injected for tests (GpqTableOptions::inject_gpu_context_loss)".into(),
            recovered: true,
        });
    }
    let mut builder = DeviceReaderBuilder::new_with_footer(&file.path, file.footer.clone())
        .with_options(options)
        .with_pass_bytes(scan.options.gpu_read_bytes)
        .with_decode_ahead(DECODE_AHEAD);
    if let Some(selection) = run_selection(units) {
        builder = builder.with_row_selection(selection);
    }
    if let Some(limit) = limit {
        builder = builder.with_limit(limit);
    }
    builder.build()
}

/// Copies a decoded batch to the host, recording the read's metrics.
fn copy_to_host(scan: &PartitionScan, table: DeviceTable) -> gpq::Result<RecordBatch> {
    let m = &scan.metrics;
    let stats = table.stats();
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
    let t0 = Instant::now();
    let (batch, pinned) = table.to_record_batch_staged()?;
    drop(table);
    m.copy_time.add_elapsed(t0);
    if !pinned {
        m.pageable_copies.add(1);
    }
    Ok(batch)
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

    #[test]
    fn run_selections_join_the_units() {
        let all = vec![unit(10), unit(10)];
        assert!(run_selection(&all).is_none());
        let mut some = all.clone();
        some[0].rg_rows = 100;
        some[1].rg_rows = 50;
        some[1].selection = Some(RowSelection::from(vec![RowSelector::skip(20), RowSelector::select(30)]));
        let sel = run_selection(&some).unwrap();
        let selectors: Vec<RowSelector> = sel.iter().copied().collect();
        assert_eq!(selectors, vec![RowSelector::select(100), RowSelector::skip(20), RowSelector::select(30)]);
    }
}
