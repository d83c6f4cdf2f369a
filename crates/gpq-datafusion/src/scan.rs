//! What every partition of a scan shares, whichever decoder runs it: the
//! partition's work ([`PartitionScan`]), its metrics, the [`Sink`] a decoder
//! sends batches into, the [`Decoder`] interface the CPU and GPU backends
//! implement, and the helpers that map a file's columns to the scan's output.
//!
//! A scan reads its *read columns*: the output columns, then the columns
//! only its own filters ([`ScanFilter`]) use. Decoders build batches of the
//! read columns; [`PartitionScan::finish_on_host`] applies the filters to a
//! batch the device did not filter and drops the filter-only columns.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::{AsArray, RecordBatch, RecordBatchOptions};
use arrow::compute::filter_record_batch;
use arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, Time};
use tokio::sync::mpsc;

use crate::device_aggregate::{AggregateMetrics, AggregateSink};
use crate::file::GpqFile;
use crate::filter::ScanFilter;
use crate::options::GpqTableOptions;
use crate::units::ScanUnit;

/// Reads a partition's row groups and sends their batches into a sink.
pub(crate) trait Decoder: Send + Sync + std::fmt::Debug {
    /// Reads every unit of `scan`, stopping early once `sink` is done.
    fn produce(&self, scan: &PartitionScan, sink: &mut Sink) -> Result<()>;
}

/// Per-partition metrics of a scan.
#[derive(Debug, Clone)]
pub(crate) struct PartitionMetrics {
    /// Bytes read from the files.
    pub bytes_read: Count,
    /// Time reading (GPU: IO wall time to device memory; CPU: file reads).
    pub io_time: Time,
    /// GPU: footer and read planning.
    pub plan_time: Time,
    /// GPU: decompression.
    pub decompress_time: Time,
    /// GPU: page headers and value decoding; CPU: decompression and decoding.
    pub decode_time: Time,
    /// GPU: copying decoded columns to the host.
    pub copy_time: Time,
    /// GPU: device reads issued.
    pub device_reads: Count,
    /// GPU: row groups decoded on the CPU because the GPU could not.
    pub gpu_fallback_row_groups: Count,
    /// GPU: device reads that lost the GPU context and were decoded on the CPU instead.
    pub gpu_context_lost_fallbacks: Count,
    /// GPU: device reads copied to pageable host memory because the pinned pool was full.
    pub pageable_copies: Count,
    /// GPU: bytes of decoded columns copied to the host.
    pub bytes_to_host: Count,
    /// Rows the scan's filters were evaluated on, on the device.
    pub device_filter_rows_in: Count,
    /// Rows the device filters kept.
    pub device_filter_rows_out: Count,
    /// Time filtering on the device (evaluation and gathers).
    pub device_filter_time: Time,
    /// Device batches the device could not filter (filtered on the host).
    pub device_filter_fallbacks: Count,
    /// The device aggregation's (see the `aggregate` module).
    pub aggregate: AggregateMetrics,
    /// Rows of the run spans whose non-filter columns late materialization
    /// did not decode (no survivor between them and the row group's ends).
    pub late_rows_skipped: Count,
    /// Rows the scan's filters were evaluated on, on the host.
    pub host_filter_rows_in: Count,
    /// Rows the host filters kept.
    pub host_filter_rows_out: Count,
    /// Time the reader waited for DataFusion to take its previous batches:
    /// where it is most of the scan's time, the query's operators above the
    /// scan are the bottleneck, not the decoding.
    pub send_wait_time: Time,
}

impl PartitionMetrics {
    /// Registers the metrics of `partition`.
    pub fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let time = |name: &'static str| MetricBuilder::new(set).subset_time(name, partition);
        let count = |name: &'static str| MetricBuilder::new(set).counter(name, partition);
        PartitionMetrics {
            bytes_read: count("bytes_read"),
            io_time: time("io_time"),
            plan_time: time("plan_time"),
            decompress_time: time("decompress_time"),
            decode_time: time("decode_time"),
            copy_time: time("copy_time"),
            device_reads: count("device_reads"),
            gpu_fallback_row_groups: count("gpu_fallback_row_groups"),
            gpu_context_lost_fallbacks: count("gpu_context_lost_fallbacks"),
            pageable_copies: count("pageable_copies"),
            bytes_to_host: count("bytes_to_host"),
            device_filter_rows_in: count("device_filter_rows_in"),
            device_filter_rows_out: count("device_filter_rows_out"),
            device_filter_time: time("device_filter_time"),
            device_filter_fallbacks: count("device_filter_fallbacks"),
            aggregate: AggregateMetrics::new(set, partition),
            late_rows_skipped: count("late_rows_skipped"),
            host_filter_rows_in: count("host_filter_rows_in"),
            host_filter_rows_out: count("host_filter_rows_out"),
            send_wait_time: time("send_wait_time"),
        }
    }
}

/// Everything one partition needs to run.
pub(crate) struct PartitionScan {
    /// The table's files.
    pub files: Arc<Vec<GpqFile>>,
    /// Row groups to read, in order.
    pub units: Vec<ScanUnit>,
    /// Table columns to output, in output order.
    pub columns: Vec<usize>,
    /// The output schema.
    pub schema: SchemaRef,
    /// Table columns to read: `columns`, then those only the filter uses.
    pub read_columns: Vec<usize>,
    /// The schema of the read columns.
    pub read_schema: SchemaRef,
    /// The pushed-down filters the scan applies itself.
    pub filter: Option<Arc<ScanFilter>>,
    /// The device the GPU backend decodes this partition on.
    pub device: usize,
    /// Rows per output batch.
    pub batch_size: usize,
    /// Most rows to output (counted after the scan's filters).
    pub limit: Option<usize>,
    /// The table's options.
    pub options: GpqTableOptions,
    /// Which decoder runs.
    pub decoder: Arc<dyn Decoder>,
    /// Metrics of this partition.
    pub metrics: PartitionMetrics,
    /// IO paths the device reads took (for `EXPLAIN ANALYZE`).
    pub io_paths: Arc<Mutex<Vec<String>>>,
    /// Where the GPU backend sends the partial aggregation of its decoded
    /// batches, when a `GpqPartialAggregateExec` runs the scan.
    pub aggregate: Option<AggregateSink>,
    /// Tests only: device reads still to fail as if the GPU context were
    /// lost, shared by the partitions of one scan
    /// ([`GpqTableOptions::inject_gpu_context_loss`]).
    pub injected_faults: Arc<AtomicUsize>,
    /// Tests only: device passes still to succeed before the injected faults.
    pub injected_after: Arc<AtomicUsize>,
}

impl PartitionScan {
    /// A batch of the read columns as the scan outputs it: filtered on the
    /// host by the scan's filters (if any), without the filter-only columns.
    pub fn finish_on_host(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let batch = match &self.filter {
            Some(f) => {
                let mask = f.host.evaluate(&batch)?.into_array(batch.num_rows())?;
                let mask = mask.as_boolean_opt().ok_or_else(|| {
                    DataFusionError::Internal(format!("gpq scan filter gave {} instead of booleans", mask.data_type()))
                })?;
                let kept = filter_record_batch(&batch, mask)?;
                self.metrics.host_filter_rows_in.add(batch.num_rows());
                self.metrics.host_filter_rows_out.add(kept.num_rows());
                kept
            }
            None => batch,
        };
        if self.read_columns.len() == self.columns.len() {
            return Ok(batch);
        }
        let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        let columns = batch.columns()[..self.columns.len()].to_vec();
        Ok(RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)?)
    }

    /// Whether a reader may stop after the sink's remaining rows: only when
    /// no filter of the scan's removes rows after the read.
    pub fn reader_limit(&self, sink: &Sink) -> Option<usize> {
        if self.filter.is_some() { None } else { sink.remaining() }
    }

    /// Whether the next device read is to fail with an injected context loss
    /// (tests only); takes one from the scan's budget of injected faults.
    pub fn take_injected_fault(&self) -> bool {
        let take = |n: usize| n.checked_sub(1);
        if self.injected_after.fetch_update(Ordering::SeqCst, Ordering::SeqCst, take).is_ok() {
            return false;
        }
        self.injected_faults
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// What a producer sends to its partition's stream.
pub(crate) enum Message {
    /// Decoded batches.
    Batches(Vec<RecordBatch>),
    /// Every unit was read.
    Done,
}

/// Where a producer puts its batches.
pub(crate) struct Sink {
    tx: mpsc::Sender<Result<Message>>,
    rows: usize,
    limit: Option<usize>,
    closed: bool,
    /// Time spent blocked on a full channel.
    wait: Time,
}

impl Sink {
    /// A sink that sends into `tx`, wants at most `limit` rows, and adds
    /// the time it waits for room in the channel to `wait`.
    pub fn new(tx: mpsc::Sender<Result<Message>>, limit: Option<usize>, wait: Time) -> Sink {
        Sink {
            tx,
            rows: 0,
            limit,
            closed: false,
            wait,
        }
    }

    /// Sends `batches` (one message); returns false once nothing more is wanted.
    pub fn send(&mut self, batches: Vec<RecordBatch>) -> bool {
        if self.done() {
            return false;
        }
        let batches: Vec<RecordBatch> = batches.into_iter().filter(|b| b.num_rows() > 0).collect();
        if !batches.is_empty() {
            let rows = batches
                .iter()
                .map(RecordBatch::num_rows)
                .fold(0usize, usize::saturating_add);
            self.rows = self.rows.saturating_add(rows);
            let _waiting = self.wait.timer();
            if self
                .tx
                .blocking_send(Ok(Message::Batches(batches)))
                .is_err()
            {
                self.closed = true;
            }
        }
        !self.done()
    }

    /// Rows still wanted, if there is a limit.
    pub fn remaining(&self) -> Option<usize> {
        self.limit.map(|l| l.saturating_sub(self.rows))
    }

    /// Whether the consumer is gone or the limit is reached.
    pub fn done(&self) -> bool {
        self.closed || self.remaining() == Some(0)
    }
}

/// Splits units into runs of consecutive units of one file.
pub(crate) fn file_runs(units: &[ScanUnit]) -> impl Iterator<Item = &[ScanUnit]> {
    units.chunk_by(|a, b| a.file == b.file)
}

/// Rebuilds `batch` with the output `schema`: column `j` of the result is
/// column `positions[j]` of `batch`, cast where the types differ.
pub(crate) fn conform(
    batch: &RecordBatch,
    positions: &[usize],
    schema: &SchemaRef,
) -> Result<RecordBatch> {
    let columns = positions
        .iter()
        .zip(schema.fields())
        .map(|(&p, field)| {
            let column = batch.columns().get(p).ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "gpq scan: decoded batch has no column {p} for {}",
                    field.name()
                ))
            })?;
            if column.data_type() == field.data_type() {
                Ok(Arc::clone(column))
            } else {
                Ok(arrow::compute::cast(column, field.data_type())?)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &options,
    )?)
}

/// The file's top-level fields to read for `columns` (sorted, deduplicated),
/// and where each output column sits among them.
pub(crate) fn read_layout(file: &GpqFile, columns: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let wanted = file.file_roots(columns);
    let mut roots = wanted.clone();
    roots.sort_unstable();
    roots.dedup();
    let positions = wanted
        .iter()
        .map(|r| roots.binary_search(r).unwrap_or(0))
        .collect();
    (roots, positions)
}

