//! The CPU backend: arrow-rs decodes the row groups of a partition.
//!
//! Consecutive row groups of one file are read by one
//! `ParquetRecordBatchReader`, with the page-index row selections joined into
//! one selection, so pruned pages are neither read nor decoded. Reads go
//! through a counting wrapper of the file, which feeds the `bytes_read` and
//! `io_time` metrics; the rest of the reader's time is `decode_time`. The
//! scan's own filters (see the `filter` module) run on each batch on the host.

use std::fs::File;
use std::io::{BufReader, Read};
use std::time::{Duration, Instant};

use bytes::Bytes;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::metrics::{Count, Time};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReaderBuilder, RowSelection, RowSelector};
use parquet::file::reader::{ChunkReader, Length};

use crate::scan::{Decoder, PartitionScan, Sink, conform, file_runs, read_layout};
use crate::to_df_error;
use crate::units::ScanUnit;

/// arrow-rs on the CPU.
#[derive(Debug)]
pub(crate) struct CpuDecoder;

impl Decoder for CpuDecoder {
    fn produce(&self, scan: &PartitionScan, sink: &mut Sink) -> Result<()> {
        for run in file_runs(&scan.units) {
            read_run(scan, run, 0, sink)?;
            if sink.done() {
                break;
            }
        }
        Ok(())
    }
}

/// Reads `units` (all of one file) and sends their batches, less the first
/// `skip` rows of their selection (read already by a device read that failed
/// part-way; counted before the scan's filters).
pub(crate) fn read_run(scan: &PartitionScan, units: &[ScanUnit], skip: usize, sink: &mut Sink) -> Result<()> {
    let Some(first) = units.first() else {
        return Ok(());
    };
    let file = scan.files.get(first.file).ok_or_else(|| {
        DataFusionError::Internal(format!("gpq scan: no file {} in the table", first.file))
    })?;
    let (roots, positions) = read_layout(file, &scan.read_columns);
    let handle = File::open(&file.path).map_err(|source| {
        to_df_error(gpq::Error::Open {
            file: file.path.clone(),
            source,
        })
    })?;
    let metrics = &scan.metrics;
    let input = CountingFile {
        file: handle,
        bytes: metrics.bytes_read.clone(),
        time: metrics.io_time.clone(),
    };
    let mut builder =
        ParquetRecordBatchReaderBuilder::new_with_metadata(input, file.reader_metadata.clone())
            .with_projection(ProjectionMask::roots(
                file.parquet_schema(),
                roots.iter().copied(),
            ))
            .with_row_groups(units.iter().map(|u| u.row_group).collect())
            .with_batch_size(scan.batch_size.max(1));
    if units.iter().any(|u| u.selection.is_some()) {
        builder = builder.with_row_selection(joined_selection(units));
    }
    if skip > 0 {
        builder = builder.with_offset(skip);
    }
    if let Some(rest) = scan.reader_limit(sink) {
        builder = builder.with_limit(rest);
    }
    let mut reader = builder.build()?;
    loop {
        let t0 = Instant::now();
        let io0 = metrics.io_time.value();
        let next = reader.next();
        let io = metrics.io_time.value().saturating_sub(io0) as u64;
        metrics
            .decode_time
            .add_duration(t0.elapsed().saturating_sub(Duration::from_nanos(io)));
        match next {
            None => return Ok(()),
            Some(batch) => {
                let batch = conform(&batch?, &positions, &scan.read_schema)?;
                let batch = scan.finish_on_host(batch)?;
                if !sink.send(vec![batch]) {
                    return Ok(());
                }
            }
        }
    }
}

/// One selection over the concatenated row groups of `units`.
pub(crate) fn joined_selection(units: &[ScanUnit]) -> RowSelection {
    let mut selectors: Vec<RowSelector> = Vec::new();
    for u in units {
        match &u.selection {
            Some(s) => selectors.extend(s.iter().copied()),
            None => selectors.push(RowSelector::select(u.rg_rows)),
        }
    }
    RowSelection::from(selectors)
}

/// A file that counts the bytes read through it and the time spent reading.
struct CountingFile {
    file: File,
    bytes: Count,
    time: Time,
}

impl Length for CountingFile {
    fn len(&self) -> u64 {
        self.file.len()
    }
}

impl ChunkReader for CountingFile {
    type T = CountingRead<BufReader<File>>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let inner = self.file.get_read(start)?;
        Ok(CountingRead {
            inner,
            bytes: self.bytes.clone(),
            time: self.time.clone(),
        })
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let t0 = Instant::now();
        let bytes = self.file.get_bytes(start, length)?;
        self.time.add_elapsed(t0);
        self.bytes.add(bytes.len());
        Ok(bytes)
    }
}

/// A reader that counts bytes and read time.
struct CountingRead<R> {
    inner: R,
    bytes: Count,
    time: Time,
}

impl<R: Read> Read for CountingRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let t0 = Instant::now();
        let n = self.inner.read(buf)?;
        self.time.add_elapsed(t0);
        self.bytes.add(n);
        Ok(n)
    }
}
