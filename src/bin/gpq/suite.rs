//! `gpq bench` (without a subcommand): the side-by-side suite over TPC-H.
//!
//! For every layout (tpchgen defaults; a GPU-friendly layout with 128 MiB row
//! groups; ZSTD) and every table, on the same files with a warm page cache and,
//! where the OS lets us drop it, a cold one: (a) gpq's read onto the GPU;
//! (b) arrow-rs on every core plus the copy of the decoded Arrow buffers to the
//! device; (c) the ceilings: gpq's IO layer alone, and a pinned host-to-device
//! copy of the same byte count. Then per column type on lineitem. Writes a
//! Markdown table and a JSON file.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use gpq::baseline;
use gpq::gpu::GpuContext;
use gpq::tpch::{self, GenOptions, Table};
use gpq::{ReadOptions, read_parquet_to_device};
use serde::Serialize;

use crate::human_bytes;

/// Arguments of the suite.
#[derive(Args, Clone)]
pub struct SuiteArgs {
    /// TPC-H scale factor of the data (generated where missing).
    #[arg(short = 's', long, default_value_t = 10.0)]
    pub scale_factor: f64,
    /// Data directory; each layout goes in <DATA>/<layout>/. Default: data/sf<SF>.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Layouts to run (comma-separated): default, gpu, zstd.
    #[arg(long, value_delimiter = ',', default_value = "default,gpu,zstd")]
    pub layouts: Vec<String>,
    /// Timed repetitions (median, after one warm-up).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Also measure with a cold page cache (needs root to drop caches).
    #[arg(long)]
    pub cold: bool,
    /// Where to write <OUT>.md and <OUT>.json.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// CPU threads for arrow-rs (default: all cores).
    #[arg(long)]
    pub cpu_threads: Option<usize>,
}

#[derive(Serialize)]
struct Row {
    layout: String,
    table: String,
    columns: String,
    cache: &'static str,
    rows: u64,
    file_bytes: u64,
    gpq_s: f64,
    arrow_rs_h2d_s: f64,
    arrow_rs_decode_s: f64,
    gpq_io_s: f64,
    pinned_copy_s: f64,
    speedup: f64,
    io_path: String,
    decompression: String,
}

fn layout_options(name: &str, sf: f64) -> gpq::Result<GenOptions> {
    let base = GenOptions { scale_factor: sf, ..Default::default() };
    Ok(match name {
        "default" => base,
        "gpu" => GenOptions { row_group_bytes: 128 << 20, ..base },
        "zstd" => GenOptions { compression: tpch::parse_compression("zstd(1)")?, ..base },
        other => return Err(gpq::Error::InvalidOptions(format!("unknown layout {other:?}: default, gpu or zstd"))),
    })
}

pub fn run(args: SuiteArgs) -> gpq::Result<ExitCode> {
    let data = args.data.clone().unwrap_or_else(|| PathBuf::from(format!("data/sf{}", args.scale_factor)));
    let ctx = GpuContext::get(0)?;
    let threads = args.cpu_threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(4));
    let pinned_bw = baseline::pinned_copy_bandwidth(&ctx, 2 << 30, 5)?;
    eprintln!("device {} ({} SMs); pinned host-to-device copy {:.1} GB/s; arrow-rs on {threads} threads", ctx.name, ctx.sm_count, pinned_bw / 1e9);
    let mut rows: Vec<Row> = Vec::new();
    let mut caches = vec!["warm"];
    if args.cold {
        if baseline::drop_page_cache() {
            caches.push("cold");
        } else {
            eprintln!("cannot drop the page cache here (not root?): cold-cache rows skipped");
        }
    }
    for layout in &args.layouts {
        let options = layout_options(layout, args.scale_factor)?;
        let dir = data.join(layout);
        for table in Table::ALL {
            let path = dir.join(format!("{}.parquet", table.name()));
            if !path.exists() {
                eprintln!("generating {} ({layout})", path.display());
                tpch::generate_table(table, &dir, &options, &|_| {})?;
            }
            let mut sets: Vec<Option<Vec<String>>> = vec![None];
            if table == Table::Lineitem {
                for c in ["l_orderkey", "l_extendedprice", "l_shipdate", "l_returnflag", "l_comment"] {
                    sets.push(Some(vec![c.to_string()]));
                }
            }
            for cols in sets {
                for &cache in &caches {
                    rows.push(measure(&ctx, &path, layout, table, cols.as_deref(), cache, &args, threads, pinned_bw)?);
                    let r = rows.last().unwrap();
                    eprintln!(
                        "{layout:>7} {:>9} {:<16} {cache}: gpq {:.4} s, arrow-rs+copy {:.4} s ({:.1}x)",
                        r.table, r.columns, r.gpq_s, r.arrow_rs_h2d_s, r.speedup
                    );
                }
            }
        }
    }
    let md = markdown(&rows, &ctx, pinned_bw, threads, &args);
    println!("{md}");
    let io = |source| gpq::Error::Io { file: args.out.clone(), offset: 0, len: 0, source };
    std::fs::write(args.out.with_extension("md"), &md).map_err(io)?;
    let json = serde_json::json!({
        "device": ctx.name,
        "pinned_copy_gbps": pinned_bw / 1e9,
        "cpu_threads": threads,
        "scale_factor": args.scale_factor,
        "repeat": args.repeat,
        "rows": rows,
    });
    std::fs::write(args.out.with_extension("json"), serde_json::to_string_pretty(&json).unwrap()).map_err(io)?;
    Ok(ExitCode::SUCCESS)
}

#[allow(clippy::too_many_arguments)]
fn measure(
    ctx: &std::sync::Arc<GpuContext>,
    path: &std::path::Path,
    layout: &str,
    table: Table,
    cols: Option<&[String]>,
    cache: &'static str,
    args: &SuiteArgs,
    threads: usize,
    pinned_bw: f64,
) -> gpq::Result<Row> {
    let mut options = ReadOptions::new();
    if let Some(c) = cols {
        options = options.with_columns(c.iter().map(|s| s.as_str()));
    }
    let cold = cache == "cold";
    let time = |f: &mut dyn FnMut() -> gpq::Result<()>| -> gpq::Result<Duration> {
        if cold {
            // One warm-up is pointless when every run starts cold; take the median of three.
            let mut t = Vec::new();
            for _ in 0..3 {
                baseline::drop_page_cache();
                let s = std::time::Instant::now();
                f()?;
                t.push(s.elapsed());
            }
            t.sort();
            Ok(t[1])
        } else {
            baseline::median_time(args.repeat, || f())
        }
    };
    let mut last = None;
    let gpq_t = time(&mut || {
        last = Some(read_parquet_to_device(path, &options)?.stats);
        Ok(())
    })?;
    let stats = last.expect("one run");
    let stream = ctx.new_stream()?;
    let mut decode_only = Duration::ZERO;
    let arrow_t = time(&mut || {
        let s = std::time::Instant::now();
        let batches = baseline::arrow_rs_parallel(path, cols, threads)?;
        decode_only = s.elapsed();
        baseline::copy_batches_to_device(&stream, &batches)?;
        Ok(())
    })?;
    let io_t = time(&mut || gpq::read_column_chunks(path, &options).map(|_| ()))?;
    let io = stats.io.as_ref().expect("io stats");
    let plan = gpq::ReadPlan::new(path, &options)?;
    Ok(Row {
        layout: layout.to_string(),
        table: table.name().to_string(),
        columns: cols.map(|c| c.join(",")).unwrap_or_else(|| "all".into()),
        cache,
        rows: plan.num_rows,
        file_bytes: plan.file_size,
        gpq_s: gpq_t.as_secs_f64(),
        arrow_rs_h2d_s: arrow_t.as_secs_f64(),
        arrow_rs_decode_s: decode_only.as_secs_f64(),
        gpq_io_s: io_t.as_secs_f64(),
        pinned_copy_s: io.bytes_read as f64 / pinned_bw,
        speedup: arrow_t.as_secs_f64() / gpq_t.as_secs_f64(),
        io_path: io.path.to_string(),
        decompression: stats.decompression.path().to_string(),
    })
}

fn markdown(rows: &[Row], ctx: &GpuContext, pinned_bw: f64, threads: usize, args: &SuiteArgs) -> String {
    let mut s = format!(
        "Device: {} ({} SMs). Pinned host-to-device copy: {:.1} GB/s. arrow-rs: {threads} threads, one task per row group. \
Scale factor {}, median of {} after one warm-up (cold: median of 3, page cache dropped before each).\n\n",
        ctx.name, ctx.sm_count, pinned_bw / 1e9, args.scale_factor, args.repeat
    );
    s.push_str("| layout | table | columns | cache | rows | file | gpq s | arrow-rs + copy s | (arrow-rs decode s) | gpq IO only s | pinned copy of file bytes s | gpq speedup | IO path | decompression |\n");
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
