//! The GPU backend: gpq reads and decodes a partition's row groups on the
//! device, then copies the columns to the host through pinned memory
//! ([`gpq::DeviceTable::to_record_batch_pinned`]).
//!
//! Consecutive row groups of one file are gathered into one device read
//! ([`gpq::read_parquet_to_device_with_footer`]) until their projected compressed bytes
//! reach [`GpqTableOptions::gpu_read_bytes`](crate::GpqTableOptions::gpu_read_bytes).
//! The device decodes whole row groups; page-index selections are applied
//! after the copy by zero-copy slicing, so pruned pages cost IO and decode
//! time but never reach the query. What the GPU cannot decode (an
//! `Unsupported` error, raised before any IO) is decoded on the CPU when
//! fallback is allowed, logged and counted.
//!
//! A device read that loses the GPU context ([`gpq::Error::is_context_lost`])
//! is decoded on the CPU instead of failing the query, logged and counted
//! (`gpu_context_lost_fallbacks`); when the device could not be reset, the
//! rest of the partition decodes on the CPU too. Errors that are the file's
//! fault ([`gpq::Error::is_bad_input`]) still fail the query: corrupt data
//! never falls back silently.

use std::time::Instant;

use arrow::array::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use tracing::warn;

use gpq::{ColumnSelector, Error, read_parquet_to_device_with_footer};

use crate::cpu::read_run;
use crate::file::GpqFile;
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
            for group in device_reads(run, scan.options.gpu_read_bytes) {
                if device_gone {
                    scan.metrics.gpu_context_lost_fallbacks.add(1);
                    read_run(scan, group, sink)?;
                } else {
                    device_gone = read_group(scan, group, sink)?;
                }
                if sink.done() {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// Cuts a run of one file's units into device reads of about `target` bytes.
fn device_reads(units: &[ScanUnit], target: u64) -> Vec<&[ScanUnit]> {
    let mut groups = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, u) in units.iter().enumerate() {
        bytes = bytes.saturating_add(u.bytes);
        if bytes >= target {
            groups.push(&units[start..=i]);
            (start, bytes) = (i + 1, 0);
        }
    }
    if start < units.len() {
        groups.push(&units[start..]);
    }
    groups
}

/// Reads `units` (consecutive row groups of one file) in one device read and
/// sends their batches. Returns whether the device is unusable for the rest
/// of the partition (it lost its context and could not be reset).
///
/// A read that loses the GPU context is decoded on the CPU instead (logged,
/// counted in `gpu_context_lost_fallbacks`): nothing of it was sent yet, so
/// the CPU answers it whole. A read the GPU cannot decode falls back the same
/// way when [`GpqTableOptions::gpu_fallback`](crate::GpqTableOptions::gpu_fallback)
/// allows. Any other error, above all one that is the file's fault, fails
/// the scan.
fn read_group(scan: &PartitionScan, units: &[ScanUnit], sink: &mut Sink) -> Result<bool> {
    let Some(first) = units.first() else {
        return Ok(false);
    };
    let file = scan.files.get(first.file).ok_or_else(|| {
        DataFusionError::Internal(format!("gpq scan: no file {} in the table", first.file))
    })?;
    let (roots, positions) = read_layout(file, &scan.columns);
    let batch = match device_read(scan, file, &roots, units) {
        Ok(batch) => batch,
        Err(e) if falls_back_to_cpu(&e) => {
            let gone = !matches!(
                e,
                Error::GpuContextLost {
                    recovered: true,
                    ..
                }
            );
            warn!(
                file = %file.path.display(),
                row_groups = units.len(),
                error = %e,
                "GPU context lost during a device read, decoding it on the CPU{}",
                if gone { " (and the rest of the partition: the device could not be reset)" } else { "" }
            );
            scan.metrics.gpu_context_lost_fallbacks.add(1);
            read_run(scan, units, sink)?;
            return Ok(gone);
        }
        Err(e @ Error::Unsupported { .. }) if scan.options.gpu_fallback => {
            warn!(file = %file.path.display(), row_groups = units.len(), "GPU cannot decode this read, decoding on the CPU: {e}");
            scan.metrics.gpu_fallback_row_groups.add(units.len());
            read_run(scan, units, sink)?;
            return Ok(false);
        }
        Err(e) => return Err(to_df_error(e)),
    };

    let expected = units
        .iter()
        .try_fold(0usize, |acc, u| acc.checked_add(u.rg_rows));
    if expected != Some(batch.num_rows()) {
        return Err(DataFusionError::Execution(format!(
            "gpq: device read of {} returned {} rows, the footer says {}",
            file.path.display(),
            batch.num_rows(),
            expected.map_or_else(|| "more than a usize holds".to_string(), |n| n.to_string())
        )));
    }
    let batch = conform(&batch, &positions, &scan.schema)?;
    sink.send(selected_slices(&batch, units));
    Ok(false)
}

/// Whether a device read that failed with `e` is answered by the CPU: the
/// GPU context was lost, and the file is not at fault.
fn falls_back_to_cpu(e: &Error) -> bool {
    e.is_context_lost() && !e.is_bad_input()
}

/// Reads and decodes the file's top-level fields `roots` of the row groups
/// of `units` on the device and copies them to the host, recording metrics.
fn device_read(
    scan: &PartitionScan,
    file: &GpqFile,
    roots: &[usize],
    units: &[ScanUnit],
) -> gpq::Result<RecordBatch> {
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
            detail: "a context loss injected for tests (GpqTableOptions::inject_gpu_context_loss)"
                .into(),
            recovered: true,
        });
    }
    let table = read_parquet_to_device_with_footer(&file.path, file.footer.clone(), &options)?;
    let m = &scan.metrics;
    let stats = table.stats();
    m.device_reads.add(1);
    m.plan_time.add_duration(stats.plan);
    m.decompress_time.add_duration(stats.decompress);
    m.decode_time
        .add_duration(stats.page_headers + stats.decode);
    if let Some(io) = &stats.io {
        m.bytes_read
            .add(usize::try_from(io.bytes_read).unwrap_or(usize::MAX));
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

/// The rows of each unit that its selection keeps, as slices of `batch`.
fn selected_slices(batch: &RecordBatch, units: &[ScanUnit]) -> Vec<RecordBatch> {
    let mut pieces = Vec::new();
    let mut offset = 0;
    for u in units {
        match &u.selection {
            None => pieces.push(batch.slice(offset, u.rg_rows)),
            Some(selection) => {
                let (mut at, end) = (offset, offset + u.rg_rows);
                for s in selection.iter() {
                    let n = s.row_count.min(end - at);
                    if !s.skip && n > 0 {
                        pieces.push(batch.slice(at, n));
                    }
                    at += n;
                }
            }
        }
        offset += u.rg_rows;
    }
    pieces
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
    fn groups_reads_by_bytes() {
        let units = vec![unit(10), unit(10), unit(30), unit(5)];
        let lens: Vec<usize> = device_reads(&units, 20).iter().map(|g| g.len()).collect();
        assert_eq!(lens, vec![2, 1, 1]);
        assert_eq!(device_reads(&units, 1).len(), 4);
        assert_eq!(device_reads(&units, 1000).len(), 1);
    }
}
