//! DataFusion integration: query Parquet files with SQL, decoded by gpq.
//!
//! [`GpqTable`] is a [`TableProvider`](datafusion::catalog::TableProvider)
//! over one file, a list of files or a directory of Parquet files with a
//! common schema; [`register_gpq`] registers one with a `SessionContext`.
//! Scans push down projections, filters and limits, report row counts and
//! column statistics to the
//! planner, and split the surviving row groups into `target_partitions`
//! partitions. Each partition streams batches of the session's batch size.
//! Before each scan every file is stat-ed, and the footer of a file whose
//! size or modification time changed since it was read is read again (a
//! rewritten file whose schema no longer fits the table fails the scan).
//!
//! # Filters
//!
//! Every pushed-down filter prunes row groups by statistics and pages by the
//! page index. With a GPU backend (and [`GpqTableOptions::device_filters`],
//! on by default) the filters the device evaluates exactly (comparisons of
//! a column with a literal or with another column of its type, `BETWEEN`,
//! `IN`, `IS [NOT] NULL`, `LIKE` with `%`, boolean columns, `AND`/`OR`/`NOT`)
//! are `Exact`: the scan evaluates them on the device right after decoding
//! ([`gpq::DeviceTable::filter_columns`]) and copies only the rows they
//! keep, reading their columns even when the query does not project them;
//! DataFusion plans no filter for them. The others are `Inexact`:
//! DataFusion filters the rows. `EXPLAIN` lists the scan's own filters
//! (`scan_filters[device]`), and the metrics count the rows before and after
//! them and the bytes copied to the host.
//!
//! With [`GpqTableOptions::late_materialization`] (off by default: it pays
//! only where the survivors cluster) a scan with device filters decodes the
//! filters' columns first, and the other output columns only from each row
//! group's first surviving row to its last, skipping row groups without
//! survivors (`late_rows_skipped` counts the rows not decoded).
//!
//! # Aggregations
//!
//! [`with_device_aggregation`] adds [`GpqAggregatePushdown`] to a session:
//! DataFusion's `Partial` step of a grouped aggregation over a GPU scan
//! (group by integer, date or string columns; `COUNT`, `SUM`, `AVG`, `MIN`,
//! `MAX` of integer and decimal expressions) then runs on the device for
//! each decoded batch ([`GpqPartialAggregateExec`]), and one row per group
//! is copied to the host instead of every row. It pays for few groups (TPC-H
//! q1's four); a grouping whose integer or date keys span more values than
//! [`GpqAggregatePushdown::max_groups`] by the scan's statistics stays
//! DataFusion's. A batch the device cannot aggregate exactly (too many
//! groups, a grouping string too long for its key, an overflow) goes to
//! DataFusion's own `Partial` step; the metrics count both
//! (`device_aggregate_rows_in`, `device_aggregate_fallbacks`).
//!
//! # Backends
//!
//! - [`Backend::Gpu`]: each partition reads its row groups of each file with
//!   gpq's batch reader ([`gpq::DeviceReaderBuilder`]) on a blocking thread
//!   while the previous batches are consumed, in passes of at most
//!   [`GpqTableOptions::gpu_read_bytes`], and at least
//!   [`GpqTableOptions::gpu_min_passes`] of them where the partition is large
//!   enough (the next pass read while the device decodes one, and decoded
//!   while DataFusion works on the one before), then copies each batch to
//!   the host in chunks of about 32 MiB, each handed to DataFusion as it
//!   lands. Of each row group it
//!   reads only the pages of the span the page index selects (first to last
//!   selected row); rows between the selected runs of a span are cut on the
//!   host.
//!   Columns the GPU cannot decode (nested types, encodings the kernels lack)
//!   are decoded on the CPU instead, logged and counted
//!   (`gpu_fallback_row_groups`), unless [`GpqTableOptions::gpu_fallback`] is
//!   off, in which case the scan fails with gpq's `Unsupported` error.
//!   A device read that loses the GPU context
//!   ([`gpq::Error::is_context_lost`]) is decoded on the CPU instead of
//!   failing the query, logged and counted (`gpu_context_lost_fallbacks`);
//!   errors that are the file's fault ([`gpq::Error::is_bad_input`]) still
//!   fail it.
//! - [`Backend::Cpu`]: arrow-rs decodes, with the same bounded read-ahead;
//!   page-index selections skip pages entirely.
//! - [`Backend::Auto`]: the GPU when a CUDA device is present, else the CPU;
//!   the choice is logged and `EXPLAIN` shows it. Scans of fewer projected
//!   compressed bytes than [`GpqTableOptions::gpu_min_scan_bytes`] (128 MiB
//!   by default) decode on the CPU too, where a device read's fixed cost
//!   per partition outweighs its speed.
//!
//! # Why a `TableProvider` and not a `FileFormat`/`FileSource`
//!
//! DataFusion 55's datasource layer (`FileSource` + `FileOpener` in a
//! `DataSourceExec`, or a `FileFormat` behind `ListingTable`) gives file
//! grouping and projection/limit plumbing for free, but it is built around
//! `object_store` and byte-range file splits, and its one Parquet source only
//! lets you swap IO, not decoding. gpq reads local files through its own IO
//! paths (GDS, cuFile, pinned bounce buffers) whole row groups at a time and
//! needs partitions made of row-group ranges with a prefetching device reader
//! behind each. A provider with its own leaf plan keeps that explicit and
//! small: file discovery, pruning and partitioning are a few hundred lines
//! here, and nothing depends on the datasource layer's fast-moving internals.
//! Where an engine's rules know only file scans (Ballista's scheduler
//! restricts them per task and reads small broadcast sides in place),
//! `gpq-ballista` wraps the planned scan in a `DataSourceExec` of one file
//! group per scan partition, whose file source runs those partitions
//! ([`GpqScanExec::metrics_set`] shares the scan's metrics with it).
//!
//! Modules, each depending only on those listed before it: `options`,
//! `file` (discovery, footers, common schema), `filter` (which filters the
//! scan applies itself, and how), `pruning` (statistics and
//! page-index pruning), `units` (what to read, partitions), `stats` (planner
//! statistics), `scan` (what a partition's decoders share: the work, the
//! sink, the `Decoder` interface), `cpu` (the arrow-rs decoder),
//! `device_run` (a run of row groups on the device: spans, reader, host
//! copy), `late` (late materialization), `gpu` (the device decoder, which
//! falls back to the CPU one), `stream` (running a partition), `exec` (the
//! plan node), `table` (the provider), `remote` (tables and
//! scans as bytes).
//!
//! # Device batches as a stream
//!
//! [`device_table_stream`] turns gpq's blocking batch reader
//! ([`gpq::DeviceReaderBuilder`]) into an async [`futures::Stream`] of
//! device tables, for async code that wants the batches on the GPU rather
//! than DataFusion's host batches.
//!
//! # Across processes
//!
//! [`GpqTable::to_bytes`] and [`GpqScanExec::to_bytes`] describe a table
//! and a planned scan without live handles (files, schema, options; the
//! scan's partitions, columns, filters and limit), for a distributed
//! engine to ship from a scheduler to executors;
//! [`GpqTable::from_bytes`] and [`GpqScanExec::from_bytes`] read the
//! footers again and rebuild them. A decoded scan reads exactly the row
//! groups its partitions list, on the backend chosen when it was planned.

#![warn(missing_docs)]

mod aggregate;
mod cpu;
mod device_aggregate;
mod device_run;
mod device_stream;
mod exec;
mod file;
mod filter;
mod gpu;
mod late;
mod options;
mod pruning;
mod remote;
mod scan;
mod stats;
mod stream;
mod table;
mod units;

use std::path::Path;
use std::sync::Arc;

use datafusion::error::DataFusionError;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::SessionContext;

pub use aggregate::{GpqAggregatePushdown, GpqPartialAggregateExec};
pub use device_aggregate::DEFAULT_DEVICE_AGGREGATION_MAX_GROUPS;
pub use device_stream::{DeviceTableStream, device_table_stream};
pub use exec::GpqScanExec;
pub use options::{Backend, DEFAULT_GPU_MIN_PASSES, DEFAULT_GPU_MIN_SCAN_BYTES, DEFAULT_GPU_READ_BYTES, GpqTableOptions};
pub use remote::ScanDevice;
pub use table::GpqTable;
pub use units::PruningSummary;

/// Registers the Parquet file or directory at `path` as table `name`, scanned by gpq.
///
/// Replaces a table of the same name. Fails (with gpq's error text) when the
/// files cannot be opened, are not Parquet, or do not share one schema.
/// Unless `options` say otherwise, strings are views when the session's
/// `schema_force_view_types` asks for them, as DataFusion's own Parquet
/// tables do.
pub fn register_gpq(
    ctx: &SessionContext,
    name: &str,
    path: impl AsRef<Path>,
    options: GpqTableOptions,
) -> datafusion::error::Result<()> {
    let mut options = options;
    if options.string_views.is_none() {
        options.string_views = Some(ctx.state().config().options().execution.parquet.schema_force_view_types);
    }
    let table = GpqTable::try_new(path, options).map_err(to_df_error)?;
    ctx.deregister_table(name)?;
    ctx.register_table(name, Arc::new(table))?;
    Ok(())
}

/// Wraps a gpq error for DataFusion, keeping its text.
pub fn to_df_error(e: gpq::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// `state` with gpq's partial aggregation on the device
/// ([`GpqAggregatePushdown`]) after DataFusion's own physical optimizer
/// rules: a session built from it aggregates over GPU scans on the device
/// where it can, and exactly as DataFusion would.
pub fn with_device_aggregation(state: SessionStateBuilder) -> SessionStateBuilder {
    state.with_physical_optimizer_rule(Arc::new(GpqAggregatePushdown::default()))
}
