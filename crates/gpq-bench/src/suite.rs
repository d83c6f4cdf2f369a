//! The side-by-side suite over TPC-H: for every layout and table, on the same
//! files with a warm page cache and, where the OS lets us drop it, a cold
//! one: (a) gpq's read onto the GPU; (b) arrow-rs on every core plus the copy
//! of the decoded Arrow buffers to the device, and arrow-rs decoding alone;
//! (c) the ceilings: gpq's IO layer alone, and a host-to-device copy from
//! page-locked memory of the very bytes gpq reads. Every column is a
//! measured median; nothing is computed from a bandwidth.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpq::cuda::GpuContext;
use gpq::{ReadOptions, ReadPlan, Result, read_column_chunks, read_parquet_to_device};
use serde::Serialize;

use crate::baseline::{self, PinnedCopy};
use crate::tpch::{self, GenOptions, Table};

/// What to run.
#[derive(Debug, Clone)]
pub struct SuiteConfig {
    /// TPC-H scale factor of the data.
    pub scale_factor: f64,
    /// Data directory; each layout goes in `<data>/<layout>/` (generated where missing).
    pub data: PathBuf,
    /// Layouts: `default`, `gpu`, `zstd` (see [`layout_options`]).
    pub layouts: Vec<String>,
    /// Tables to measure.
    pub tables: Vec<Table>,
    /// Timed runs per measurement (median, after one warm-up).
    pub repeat: usize,
    /// Also measure with a cold page cache (root only).
    pub cold: bool,
    /// CPU threads for arrow-rs.
    pub cpu_threads: usize,
}

/// One measured row.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Layout name.
    pub layout: String,
    /// Table name.
    pub table: String,
    /// `all` or the comma-separated columns read.
    pub columns: String,
    /// `warm` or `cold`.
    pub cache: &'static str,
    /// Rows read.
    pub rows: u64,
    /// Size of the file.
    pub file_bytes: u64,
    /// Bytes gpq reads for this selection (the pinned copy moves the same).
    pub read_bytes: u64,
    /// gpq onto the GPU, median seconds.
    pub gpq_s: f64,
    /// arrow-rs decode plus copy to the device, median seconds.
    pub arrow_rs_h2d_s: f64,
    /// arrow-rs decode alone, median seconds (of the same runs).
    pub arrow_rs_decode_s: f64,
    /// gpq's IO layer alone, median seconds.
    pub gpq_io_s: f64,
    /// Host-to-device copy of `read_bytes` from page-locked memory, median seconds.
    pub pinned_copy_s: f64,
    /// `arrow_rs_h2d_s / gpq_s`.
    pub speedup: f64,
    /// gpq's IO path.
    pub io_path: String,
    /// gpq's decompression path.
    pub decompression: String,
}

/// Generation options of a layout: `default` (tpchgen-cli's), `gpu`
/// (128 MiB row groups) or `zstd` (ZSTD level 1).
pub fn layout_options(name: &str, sf: f64) -> Result<GenOptions> {
    let base = GenOptions { scale_factor: sf, ..Default::default() };
    Ok(match name {
        "default" => base,
        "gpu" => GenOptions { row_group_bytes: 128 << 20, ..base },
        "zstd" => GenOptions { compression: tpch::parse_compression("zstd(1)")?, ..base },
        other => return Err(gpq::Error::InvalidOptions(format!("unknown layout {other:?}: default, gpu or zstd"))),
    })
}

/// The column sets measured on `table`: all columns, and on lineitem one
/// column of each kind as well.
pub fn column_sets(table: Table) -> Vec<Option<Vec<String>>> {
    let mut sets = vec![None];
    if table == Table::Lineitem {
        for c in ["l_orderkey", "l_extendedprice", "l_shipdate", "l_returnflag", "l_comment"] {
            sets.push(Some(vec![c.to_string()]));
        }
    }
    sets
}

/// Runs the suite; `progress` sees each row as it is measured.
pub fn run(ctx: &Arc<GpuContext>, config: &SuiteConfig, progress: &dyn Fn(&Row)) -> Result<Vec<Row>> {
    let mut caches = vec!["warm"];
    if config.cold {
        if baseline::drop_page_cache() {
            caches.push("cold");
        } else {
            tracing::warn!("cannot drop the page cache here (not root?): cold-cache rows skipped");
        }
    }
    let mut rows = Vec::new();
    for layout in &config.layouts {
        let options = layout_options(layout, config.scale_factor)?;
        let dir = config.data.join(layout);
        for &table in &config.tables {
            let path = dir.join(format!("{}.parquet", table.name()));
            if !path.exists() {
                tpch::generate_table(table, &dir, &options, &|_| {})?;
            }
            for cols in column_sets(table) {
                for &cache in &caches {
                    let row = measure(ctx, &path, layout, table, cols.as_deref(), cache, config)?;
                    progress(&row);
                    rows.push(row);
                }
            }
        }
    }
    Ok(rows)
}

/// Measures one (file, columns, cache) row.
pub fn measure(
    ctx: &Arc<GpuContext>,
    path: &Path,
    layout: &str,
    table: Table,
    cols: Option<&[String]>,
    cache: &'static str,
    config: &SuiteConfig,
) -> Result<Row> {
    let mut options = ReadOptions::new();
    if let Some(c) = cols {
        options = options.with_columns(c.iter().map(|s| s.as_str()));
    }
    let cold = cache == "cold";
    // Cold: every run starts with the page cache dropped, so a warm-up would
    // measure nothing; three runs. Warm: one warm-up, then `repeat` runs.
    let (warmup, runs) = if cold { (0, 3) } else { (1, config.repeat) };
    let before: &dyn Fn() = if cold {
        &|| {
            baseline::drop_page_cache();
        }
    } else {
        &|| {}
    };
    let mut last = None;
    let gpq_t = baseline::median_time(warmup, runs, before, || {
        last = Some(read_parquet_to_device(path, &options)?.stats().clone());
        Ok(())
    })?;
    let stats = last.ok_or_else(|| gpq::Error::Internal("no timed run".into()))?;
    let stream = ctx.new_stream()?;
    let arrow = baseline::time_arrow_rs(&stream, path, cols, config.cpu_threads, warmup, runs, before)?;
    let io_t = baseline::median_time(warmup, runs, before, || read_column_chunks(path, &options).map(|_| ()))?;
    let plan = ReadPlan::new(path, &options)?;
    let ranges: Vec<(u64, u64)> = plan.io().ranges.iter().map(|r| (r.file_offset, r.read_len)).collect();
    let copy = PinnedCopy::of_ranges(ctx, path, &ranges)?;
    let pinned_t = copy.median(config.repeat)?;
    let io = stats.io.as_ref().ok_or_else(|| gpq::Error::Internal("a read without IO statistics".into()))?;
    let secs = Duration::as_secs_f64;
    Ok(Row {
        layout: layout.to_string(),
        table: table.name().to_string(),
        columns: cols.map(|c| c.join(",")).unwrap_or_else(|| "all".into()),
        cache,
        rows: plan.num_rows(),
        file_bytes: plan.file_size(),
        read_bytes: copy.len(),
        gpq_s: secs(&gpq_t),
        arrow_rs_h2d_s: secs(&arrow.total),
        arrow_rs_decode_s: secs(&arrow.decode),
        gpq_io_s: secs(&io_t),
        pinned_copy_s: secs(&pinned_t),
        speedup: secs(&arrow.total) / secs(&gpq_t).max(1e-9),
        io_path: io.path.to_string(),
        decompression: stats.decompression.path().to_string(),
    })
}

/// Formats bytes with a binary unit.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{n} B") } else { format!("{v:.2} {}", UNITS[u]) }
}

/// The rows as a Markdown table, with a header naming the machine and method.
pub fn markdown(rows: &[Row], ctx: &GpuContext, config: &SuiteConfig) -> String {
    let best_copy = rows
        .iter()
        .filter(|r| r.pinned_copy_s > 0.0)
        .max_by_key(|r| r.read_bytes)
        .map(|r| r.read_bytes as f64 / r.pinned_copy_s / 1e9)
        .unwrap_or(0.0);
    let mut s = format!(
        "Device: {} ({} SMs). Pinned host-to-device copy of the largest read: {best_copy:.1} GB/s. arrow-rs: {} threads, one task per row group. \
Scale factor {}, median of {} after one warm-up (cold: median of 3, page cache dropped before each run). \
Every column is measured; the pinned copy moves the bytes gpq reads, from page-locked memory.\n\n",
        ctx.name, ctx.sm_count, config.cpu_threads, config.scale_factor, config.repeat
    );
    s.push_str("| layout | table | columns | cache | rows | file | gpq s | arrow-rs + copy s | arrow-rs decode s | gpq IO only s | pinned copy s | gpq speed-up | IO path | decompression |\n");
    s.push_str("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.4} | {:.4} | {:.4} | {:.4} | {:.4} | {:.1}x | {} | {} |\n",
            r.layout,
            r.table,
            r.columns,
            r.cache,
            r.rows,
            human_bytes(r.file_bytes),
            r.gpq_s,
            r.arrow_rs_h2d_s,
            r.arrow_rs_decode_s,
            r.gpq_io_s,
            r.pinned_copy_s,
            r.speedup,
            r.io_path,
            r.decompression
        ));
    }
    s
}
