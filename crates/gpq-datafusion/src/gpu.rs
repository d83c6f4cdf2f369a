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

use std::time::Instant;

use arrow::array::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use tracing::warn;

use gpq::{ColumnSelector, Error, read_parquet_to_device_with_footer};

use crate::cpu::read_run;
use crate::scan::{Decoder, PartitionScan, Sink, conform, file_runs, read_layout};
use crate::to_df_error;
use crate::units::ScanUnit;

/// gpq on the GPU.
#[derive(Debug)]
pub(crate) struct GpuDecoder;

impl Decoder for GpuDecoder {
    fn produce(&self, scan: &PartitionScan, sink: &mut Sink) -> Result<()> {
        for run in file_runs(&scan.units) {
            for group in device_reads(run, scan.options.gpu_read_bytes) {
                read_group(scan, group, sink)?;
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
        bytes += u.bytes;
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

fn read_group(scan: &PartitionScan, units: &[ScanUnit], sink: &mut Sink) -> Result<()> {
    let Some(first) = units.first() else {
        return Ok(());
    };
    let file = &scan.files[first.file];
    let (roots, positions) = read_layout(file, &scan.columns);
    let options = scan
        .options
        .read
        .clone()
        .with_columns(roots.iter().map(|&r| ColumnSelector::Index(r)))
        .with_row_groups(units.iter().map(|u| u.row_group));
    let table = match read_parquet_to_device_with_footer(&file.path, file.footer.clone(), &options)
    {
        Ok(table) => table,
        Err(e @ Error::Unsupported { .. }) if scan.options.gpu_fallback => {
            warn!(file = %file.path.display(), row_groups = units.len(), "GPU cannot decode this read, decoding on the CPU: {e}");
            scan.metrics.gpu_fallback_row_groups.add(units.len());
            return read_run(scan, units, sink);
        }
        Err(e) => return Err(to_df_error(e)),
    };
    let m = &scan.metrics;
    let stats = table.stats();
    m.device_reads.add(1);
    m.plan_time.add_duration(stats.plan);
    m.decompress_time.add_duration(stats.decompress);
    m.decode_time
        .add_duration(stats.page_headers + stats.decode);
    if let Some(io) = &stats.io {
        m.bytes_read.add(io.bytes_read as usize);
        m.io_time.add_duration(io.wall);
        let mut seen = scan.io_paths.lock().unwrap_or_else(|p| p.into_inner());
        if !seen.iter().any(|p| p == io.path.name()) {
            seen.push(io.path.name().to_string());
        }
    }
    let t0 = Instant::now();
    let (batch, pinned) = table.to_record_batch_staged().map_err(to_df_error)?;
    drop(table);
    m.copy_time.add_elapsed(t0);
    if !pinned {
        m.pageable_copies.add(1);
    }

    let expected: usize = units.iter().map(|u| u.rg_rows).sum();
    if batch.num_rows() != expected {
        return Err(DataFusionError::Execution(format!(
            "gpq: device read of {} returned {} rows, the footer says {expected}",
            file.path.display(),
            batch.num_rows()
        )));
    }
    let batch = conform(&batch, &positions, &scan.schema)?;
    sink.send(selected_slices(&batch, units));
    Ok(())
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
    fn groups_reads_by_bytes() {
        let units = vec![unit(10), unit(10), unit(30), unit(5)];
        let lens: Vec<usize> = device_reads(&units, 20).iter().map(|g| g.len()).collect();
        assert_eq!(lens, vec![2, 1, 1]);
        assert_eq!(device_reads(&units, 1).len(), 4);
        assert_eq!(device_reads(&units, 1000).len(), 1);
    }
}
